"""The SQL functions on a connection you give, in your transaction, without retries: for writes
under a fence inside your own transaction, or when you manage connections yourself (in
pg_fence.aio, coroutines on an asyncio connection).

PF001, PF002 and an acquire's 57014 or 55P03 come back as LeaseLost, StaleFence and WaitCancelled;
everything else as psycopg raised it."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Iterable, List, Mapping, Optional, TypeVar

import psycopg

from . import lease as q
from .errors import translate
from .lease import Held, Lease, LeaseSet, LeaseStatus, Seconds

H = TypeVar("H", Lease, LeaseSet)


async def one(conn: psycopg.AsyncConnection, query: q.Query, key: str, waiting: bool = False) -> Optional[tuple]:
    try:
        cursor = await conn.execute(*query)
        return await cursor.fetchone()
    except psycopg.Error as err:
        raise translate(err, key, waiting=waiting) from err


async def rows(conn: psycopg.AsyncConnection, query: q.Query, key: str, waiting: bool = False) -> List[tuple]:
    try:
        cursor = await conn.execute(*query)
        return await cursor.fetchall()
    except psycopg.Error as err:
        raise translate(err, key, waiting=waiting) from err


async def acquire(
    conn: psycopg.AsyncConnection,
    key: str,
    ttl: Seconds,
    *,
    owner: Optional[str] = None,
    wait: Seconds = 0,
    session_bound: bool = False,
    durable: bool = True,
    token: Optional[uuid.UUID] = None,
    shared: bool = False,
    permits: int = 1,
    lock_delay: Seconds = 0,
) -> Optional[Lease]:
    """The lease on `key`, or None when the key cannot be granted now (held, or all its permits
    taken) and `wait` ran out. `shared=True` for a lease any number may hold at once (never beside
    an exclusive one), `permits=N` for one of at most N."""
    request = q.Acquire(key, ttl, owner, wait, session_bound, durable, shared, permits, lock_delay)
    return await acquire_with(conn, request, token or q.new_token())


async def acquire_with(conn: psycopg.AsyncConnection, request: q.Acquire, token: Optional[uuid.UUID]) -> Any:
    """`request` (an Acquire, or an AcquireAll, which takes no token): its Lease, LeaseSet or None."""
    return request.parse(await rows(conn, request.query(token), request.label, waiting=True))


async def acquire_all(
    conn: psycopg.AsyncConnection,
    keys: Iterable[str],
    ttl: Seconds,
    *,
    owner: Optional[str] = None,
    wait: Seconds = 0,
    session_bound: bool = False,
    durable: bool = True,
) -> Optional[LeaseSet]:
    """A lease on every key of `keys`, all sharing one token, or None when any of them is held (and
    `wait` ran out): lease_acquire_all grants all or none."""
    return await acquire_with(conn, q.acquire_all_request(keys, ttl, owner, wait, session_bound, durable), None)


async def renew(conn: psycopg.AsyncConnection, lease: H, ttl: Seconds) -> H:
    """The lease (or set) with its new expiry; LeaseLost when its token no longer holds the key
    (for a set: any of its keys, and then none is renewed)."""
    return lease.renewed(_expiry(await one(conn, lease.renew_query(ttl), lease.label)))


async def renew_all(conn: psycopg.AsyncConnection, lease_set: LeaseSet, ttl: Seconds) -> LeaseSet:
    """lease_renew_all: every lease of the set renewed, or LeaseLost and none."""
    return await renew(conn, lease_set, ttl)


async def release(conn: psycopg.AsyncConnection, lease: Lease) -> bool:
    """True when this call ended the lease; False when it had already ended."""
    return await ended(conn, lease)


async def release_all(conn: psycopg.AsyncConnection, lease_set: LeaseSet) -> int:
    """lease_release_all: how many of the set's leases this call ended."""
    row = await one(conn, lease_set.release_query(), lease_set.label)
    return int(row[0]) if row and row[0] is not None else 0


async def ended(conn: psycopg.AsyncConnection, held: Held) -> bool:
    """Releases a lease or a set: True when this call ended it (for a set, every one of its leases)."""
    return held.ended(await one(conn, held.release_query(), held.label))


async def status(conn: psycopg.AsyncConnection, key: str, token: uuid.UUID) -> LeaseStatus:
    """fence.lease_status: whether the lease `token` was granted on `key` is live, and if not, why it ended."""
    row = await one(conn, q.status_query(key, token), key)
    assert row is not None, "lease_status returns one row"
    return LeaseStatus(*row)


async def current_fence(conn: psycopg.AsyncConnection, key: str) -> Optional[int]:
    row = await one(conn, q.current_fence_query(key), key)
    return row[0] if row else None


async def fence_guard(conn: psycopg.AsyncConnection, key: str, fence: int) -> None:
    """Raises StaleFence unless `fence` is the key's live fence; holds the key against grants
    until your transaction ends, so run your writes in the same transaction."""
    await one(conn, q.guard_query(key, fence), key)


async def fenced_update(
    conn: psycopg.AsyncConnection,
    key: str,
    fence: int,
    table: str,
    changes: Mapping[str, Any],
    filter: Mapping[str, Any],
) -> int:
    """UPDATE table SET changes WHERE filter, under the guard; the number of rows updated."""
    row = await one(conn, q.fenced_update_query(key, fence, table, changes, filter), key)
    return int(row[0]) if row else 0


async def fenced_write(
    conn: psycopg.AsyncConnection,
    table: str,
    fence_column: str,
    fence: int,
    changes: Mapping[str, Any],
    filter: Mapping[str, Any],
) -> int:
    """UPDATE unless a matching row holds a higher fence (StaleFence); sets fence_column."""
    row = await one(conn, q.fenced_write_query(table, fence_column, fence, changes, filter), table)
    return int(row[0]) if row else 0


def _expiry(row: Optional[tuple]) -> datetime:
    assert row is not None and row[0] is not None, "lease_renew returns a timestamp or raises"
    return row[0]
