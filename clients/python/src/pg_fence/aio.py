"""The asyncio API: the same calls, kept leases and electors as the sync one, on
psycopg.AsyncConnection (or a psycopg_pool.AsyncConnectionPool). The sync API is generated from
it (tools/async_to_sync.py); the statements and the local-deadline rule are neither's (lease.py,
holding.py)."""

from .aio_caller import retrying
from .aio_calls import (
    acquire,
    acquire_all,
    acquire_with,
    current_fence,
    ended,
    fence_guard,
    fenced_update,
    fenced_write,
    one,
    release,
    release_all,
    renew,
    renew_all,
    rows,
    status,
)
from .aio_client import AsyncClient
from .aio_connections import AsyncConnections, bounded, cancel
from .aio_elector import AsyncElector, AsyncLeadership
from .aio_keeper import AsyncKeptLease, AsyncKeptLeaseSet

__all__ = [
    "AsyncClient",
    "AsyncKeptLease",
    "AsyncKeptLeaseSet",
    "AsyncElector",
    "AsyncLeadership",
    "AsyncConnections",
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
    "acquire_with",
    "one",
    "rows",
    "ended",
    "bounded",
    "cancel",
    "retrying",
]
