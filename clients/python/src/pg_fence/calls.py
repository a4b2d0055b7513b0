"""The SQL functions on a connection you give, in your transaction, without retries: for writes
under a fence inside your own transaction, or when you manage connections yourself.

PF001, PF002 and an acquire's 57014 or 55P03 come back as LeaseLost, StaleFence and WaitCancelled;
everything else as psycopg raised it."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Mapping, Optional

import psycopg

from . import lease as q
from .errors import translate
from .lease import Lease, Seconds


def one(conn: psycopg.Connection, query: q.Query, key: str, waiting: bool = False) -> Optional[tuple]:
    try:
        return conn.execute(*query).fetchone()
    except psycopg.Error as err:
        raise translate(err, key, waiting=waiting) from err


def acquire(
    conn: psycopg.Connection,
    key: str,
    ttl: Seconds,
    *,
    owner: Optional[str] = None,
    wait: Seconds = 0,
    session_bound: bool = False,
    durable: bool = True,
    token: Optional[uuid.UUID] = None,
) -> Optional[Lease]:
    """The lease on `key`, or None when another live lease holds it (and `wait` ran out)."""
    return acquire_with(conn, q.Acquire(key, ttl, owner, wait, session_bound, durable), token or q.new_token())


def acquire_with(conn: psycopg.Connection, request: q.Acquire, token: uuid.UUID) -> Optional[Lease]:
    return q.parse_acquire(one(conn, request.query(token), request.key, waiting=True), request.durable)


def renew(conn: psycopg.Connection, lease: Lease, ttl: Seconds) -> Lease:
    """The lease with its new expiry; LeaseLost when its token no longer holds the key."""
    return lease.renewed(_expiry(one(conn, q.renew_query(lease, ttl), lease.key)))


def release(conn: psycopg.Connection, lease: Lease) -> bool:
    """True when this call ended the lease; False when it had already ended."""
    row = one(conn, q.release_query(lease.key, lease.token), lease.key)
    return bool(row and row[0])


def release_token(conn: psycopg.Connection, key: str, token: uuid.UUID) -> bool:
    """Releases whatever live lease on `key` holds `token`: for a grant whose reply never came."""
    row = one(conn, q.release_query(key, token), key)
    return bool(row and row[0])


def current_fence(conn: psycopg.Connection, key: str) -> Optional[int]:
    row = one(conn, q.current_fence_query(key), key)
    return row[0] if row else None


def fence_guard(conn: psycopg.Connection, key: str, fence: int) -> None:
    """Raises StaleFence unless `fence` is the key's live fence; holds the key against grants
    until your transaction ends, so run your writes in the same transaction."""
    one(conn, q.guard_query(key, fence), key)


def fenced_update(
    conn: psycopg.Connection,
    key: str,
    fence: int,
    table: str,
    changes: Mapping[str, Any],
    filter: Mapping[str, Any],
) -> int:
    """UPDATE table SET changes WHERE filter, under the guard; the number of rows updated."""
    row = one(conn, q.fenced_update_query(key, fence, table, changes, filter), key)
    return int(row[0]) if row else 0


def fenced_write(
    conn: psycopg.Connection,
    table: str,
    fence_column: str,
    fence: int,
    changes: Mapping[str, Any],
    filter: Mapping[str, Any],
) -> int:
    """UPDATE unless a matching row holds a higher fence (StaleFence); sets fence_column."""
    row = one(conn, q.fenced_write_query(table, fence_column, fence, changes, filter), table)
    return int(row[0]) if row else 0


def _expiry(row: Optional[tuple]) -> datetime:
    assert row is not None and row[0] is not None, "lease_renew returns a timestamp or raises"
    return row[0]
