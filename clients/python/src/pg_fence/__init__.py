"""pg_fence for Python: leases on PostgreSQL that renew themselves, say when they are lost, and
retry safely. See README.md beside this package."""

from .calls import (
    acquire,
    acquire_all,
    current_fence,
    fence_guard,
    fenced_update,
    fenced_write,
    release,
    release_all,
    renew,
    renew_all,
    status,
)
from .client import Client
from .election import Blind, Leader
from .errors import ConnectFailed, LeaseLost, OutcomeUnknown, PgFenceError, StaleFence, WaitCancelled, WaitTimedOut
from .keeper import KeptLease, KeptLeaseSet
from .lease import Lease, LeaseSet, LeaseStatus
from .observer import Observer
from .reasons import LossReason
from .retry import Retry

__all__ = [
    "Client",
    "KeptLease",
    "KeptLeaseSet",
    "Lease",
    "LeaseSet",
    "LeaseStatus",
    "LossReason",
    "Observer",
    "Retry",
    "Blind",
    "Leader",
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
    "acquire_all",
    "renew_all",
    "release_all",
    "current_fence",
    "status",
    "fence_guard",
    "fenced_update",
    "fenced_write",
]
