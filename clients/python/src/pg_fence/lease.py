"""A granted lease, and the SQL of every call, shared by the sync and the asyncio API.

Each `*_query` returns (sql, params) for psycopg; each `parse_*` reads its one result row. Keeping
them here means both APIs send the very same statements."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Mapping, Optional, Tuple, Union

from psycopg.types.json import Jsonb

Seconds = Union[int, float, timedelta]
Query = Tuple[str, tuple]


@dataclass(frozen=True)
class Lease:
    """What lease_acquire granted. `token` is the secret that renew and release require."""

    key: str
    owner: str
    fence: int
    token: uuid.UUID
    acquired_at: datetime
    expires_at: datetime
    durable: bool = True

    def renewed(self, expires_at: datetime) -> "Lease":
        return replace(self, expires_at=expires_at)


def interval(value: Seconds) -> timedelta:
    """Seconds as a timedelta, which psycopg sends as an interval (an int would be a smallint,
    and lease_acquire(text, smallint) does not exist)."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected seconds or a timedelta, got {type(value).__name__}")
    return timedelta(seconds=value)


def acquire_query(
    key: str,
    ttl: Seconds,
    owner: Optional[str],
    wait: Seconds,
    session_bound: bool,
    durable: bool,
    token: uuid.UUID,
) -> Query:
    # Named columns, not `*`: a refused acquire returns NULL, which `SELECT *` turns into one
    # row of NULLs; parse_acquire tells it by its NULL fence.
    return (
        "SELECT key, owner, fence, token, acquired_at, expires_at FROM fence.lease_acquire(%s, %s, %s, %s, %s, %s, %s)",
        (key, interval(ttl), owner, interval(wait), session_bound, durable, token),
    )


@dataclass(frozen=True)
class Acquire:
    """An acquire's arguments but the token, which a kept lease may have to draw anew."""

    key: str
    ttl: Seconds
    owner: Optional[str] = None
    wait: Seconds = 0
    session_bound: bool = False
    durable: bool = True

    def query(self, token: uuid.UUID) -> Query:
        return acquire_query(self.key, self.ttl, self.owner, self.wait, self.session_bound, self.durable, token)

    def seconds(self) -> Tuple[float, float]:
        """(ttl, wait) in seconds."""
        return interval(self.ttl).total_seconds(), interval(self.wait).total_seconds()


def parse_acquire(row: Optional[tuple], durable: bool) -> Optional[Lease]:
    if row is None or row[2] is None:
        return None
    key, owner, fence, token, acquired_at, expires_at = row
    return Lease(key, owner, fence, token, acquired_at, expires_at, durable)


def renew_query(lease: Lease, ttl: Seconds) -> Query:
    return ("SELECT fence.lease_renew(%s, %s, %s)", (lease.key, lease.token, interval(ttl)))


def release_query(key: str, token: uuid.UUID) -> Query:
    return ("SELECT fence.lease_release(%s, %s)", (key, token))


def current_fence_query(key: str) -> Query:
    return ("SELECT fence.current_fence(%s)", (key,))


def guard_query(key: str, fence: int) -> Query:
    return ("SELECT fence.fence_guard(%s, %s)", (key, fence))


def fenced_update_query(
    key: str, fence: int, table: str, changes: Mapping[str, Any], filter: Mapping[str, Any]
) -> Query:
    return (
        "SELECT fence.fenced_update(%s, %s, %s::regclass, %s, %s)",
        (key, fence, table, Jsonb(dict(changes)), Jsonb(dict(filter))),
    )


def fenced_write_query(
    table: str, fence_column: str, fence: int, changes: Mapping[str, Any], filter: Mapping[str, Any]
) -> Query:
    return (
        "SELECT fence.fenced_write(%s::regclass, %s, %s, %s, %s)",
        (table, fence_column, fence, Jsonb(dict(changes)), Jsonb(dict(filter))),
    )


def new_token() -> uuid.UUID:
    return uuid.uuid4()
