"""pg_fence for Python: leases on PostgreSQL that renew themselves, say when they are lost, and
retry safely. See README.md beside this package."""

from .calls import acquire, current_fence, fence_guard, fenced_update, fenced_write, release, renew
from .client import Client
from .errors import ConnectFailed, LeaseLost, OutcomeUnknown, PgFenceError, StaleFence, WaitCancelled, WaitTimedOut
from .keeper import KeptLease
from .lease import Lease
from .retry import Retry

__all__ = [
    "Client",
    "KeptLease",
    "Lease",
    "Retry",
    "PgFenceError",
    "LeaseLost",
    "StaleFence",
    "WaitTimedOut",
    "WaitCancelled",
    "OutcomeUnknown",
    "ConnectFailed",
    "acquire",
    "renew",
    "release",
    "current_fence",
    "fence_guard",
    "fenced_update",
    "fenced_write",
]
