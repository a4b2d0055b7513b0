"""A granted lease, and the SQL of every call, shared by the sync and the asyncio API.

Each `*_query` returns (sql, params) for psycopg; each `parse_*` reads its one result row. Keeping
them here means both APIs send the very same statements."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Tuple, Union

from psycopg.types.json import Jsonb
from psycopg.types.numeric import Int4

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
    shared: bool = False
    permits: int = 1

    @property
    def label(self) -> str:
        """What errors and logs name the lease by: its key."""
        return self.key

    def renewed(self, expires_at: datetime) -> "Lease":
        return replace(self, expires_at=expires_at)

    def renew_query(self, ttl: "Seconds") -> "Query":
        return ("SELECT fence.lease_renew(%s, %s, %s)", (self.key, self.token, interval(ttl)))

    def release_query(self) -> "Query":
        return release_query(self.key, self.token)

    def status_query(self) -> "Query":
        """lease_status of this lease: (state, reason, ...)."""
        return status_query(self.key, self.token)

    @staticmethod
    def ended(row: Optional[tuple]) -> bool:
        """Whether the release whose result is `row` ended the lease."""
        return bool(row and row[0])


@dataclass(frozen=True)
class LeaseSet:
    """What lease_acquire_all granted: a lease per key (in key order), each with its own fence, all
    sharing one token, renewed and released together."""

    leases: Tuple[Lease, ...]

    @property
    def token(self) -> uuid.UUID:
        return self.leases[0].token

    @property
    def keys(self) -> Tuple[str, ...]:
        return tuple(lease.key for lease in self.leases)

    @property
    def fences(self) -> Dict[str, int]:
        return {lease.key: lease.fence for lease in self.leases}

    @property
    def expires_at(self) -> datetime:
        """The earliest expiry of the set's leases."""
        return min(lease.expires_at for lease in self.leases)

    @property
    def durable(self) -> bool:
        return self.leases[0].durable

    @property
    def label(self) -> str:
        """What errors and logs name the set by: its keys, comma-separated."""
        return ", ".join(self.keys)

    def renewed(self, expires_at: datetime) -> "LeaseSet":
        return LeaseSet(tuple(lease.renewed(expires_at) for lease in self.leases))

    def renew_query(self, ttl: "Seconds") -> "Query":
        return ("SELECT fence.lease_renew_all(%s, %s, %s)", (list(self.keys), self.token, interval(ttl)))

    def release_query(self) -> "Query":
        return ("SELECT fence.lease_release_all(%s, %s)", (list(self.keys), self.token))

    def status_query(self) -> "Query":
        """lease_status's (state, reason) of each lease of the set, in key order."""
        return (
            "SELECT s.state, s.reason FROM unnest(%s::text[]) WITH ORDINALITY AS k(key, n)"
            " CROSS JOIN LATERAL fence.lease_status(k.key, %s) AS s ORDER BY k.n",
            (list(self.keys), self.token),
        )

    def ended(self, row: Optional[tuple]) -> bool:
        """Whether the release whose result is `row` ended every lease of the set (a set of which
        some lease had ended already was lost)."""
        return bool(row and row[0] == len(self.leases))


#: What a kept lease keeps: a lease, or a lease set.
Held = Union[Lease, LeaseSet]


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
    shared: bool = False,
    permits: int = 1,
    lock_delay: Seconds = 0,
) -> Query:
    # Named columns, not `*`: a refused acquire returns NULL, which `SELECT *` turns into one
    # row of NULLs; Acquire.parse tells it by its NULL fence. `shared`, `permits` and `lock_delay`
    # are passed by name and only when asked for, so that plain leases work on servers without them.
    modes, params = "", (key, interval(ttl), owner, interval(wait), session_bound, durable, token)
    if shared:
        modes, params = ", shared => %s", (*params, True)
    if permits != 1:
        modes, params = f"{modes}, permits => %s", (*params, Int4(permits))
    if interval(lock_delay):
        modes, params = f"{modes}, lock_delay => %s", (*params, interval(lock_delay))
    return (
        "SELECT key, owner, fence, token, acquired_at, expires_at"
        f" FROM fence.lease_acquire(%s, %s, %s, %s, %s, %s, %s{modes})",
        params,
    )


def check_mode(shared: bool, permits: int) -> None:
    """Refuses, before anything is sent, `shared` and `permits` that cannot go together."""
    if not isinstance(shared, bool):
        raise TypeError(f"shared must be a bool, got {type(shared).__name__}")
    if isinstance(permits, bool) or not isinstance(permits, int):
        raise TypeError(f"permits must be an int, got {type(permits).__name__}")
    if permits < 1:
        raise ValueError(f"permits must be at least 1, not {permits}")
    if shared and permits > 1:
        raise ValueError("a shared lease cannot have permits: pass shared=True or permits=N, not both")


@dataclass(frozen=True)
class Acquire:
    """An acquire's arguments but the token, which a kept lease may have to draw anew."""

    key: str
    ttl: Seconds
    owner: Optional[str] = None
    wait: Seconds = 0
    session_bound: bool = False
    durable: bool = True
    shared: bool = False
    permits: int = 1
    lock_delay: Seconds = 0

    def __post_init__(self) -> None:
        check_mode(self.shared, self.permits)
        interval(self.lock_delay)  # TypeError for what is not a duration

    @property
    def label(self) -> str:
        return self.key

    def query(self, token: uuid.UUID) -> Query:
        return acquire_query(
            self.key,
            self.ttl,
            self.owner,
            self.wait,
            self.session_bound,
            self.durable,
            token,
            self.shared,
            self.permits,
            self.lock_delay,
        )

    def seconds(self) -> Tuple[float, float]:
        """(ttl, wait) in seconds."""
        return interval(self.ttl).total_seconds(), interval(self.wait).total_seconds()

    def parse(self, rows: Sequence[tuple]) -> Optional[Lease]:
        if not rows or rows[0][2] is None:
            return None
        key, owner, fence, token, acquired_at, expires_at = rows[0]
        return Lease(key, owner, fence, token, acquired_at, expires_at, self.durable, self.shared, self.permits)


@dataclass(frozen=True)
class AcquireAll(Acquire):
    """lease_acquire_all's arguments: `key` is unused, `keys` the set. It takes no token: the server
    draws the set's, so a try whose reply was lost cannot be retried by token (see retry.py)."""

    keys: Tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return ", ".join(self.keys)

    def query(self, token: Optional[uuid.UUID] = None) -> Query:
        return (
            "SELECT key, owner, fence, token, acquired_at, expires_at"
            " FROM fence.lease_acquire_all(%s, %s, %s, %s, %s, %s)",
            (list(self.keys), interval(self.ttl), self.owner, interval(self.wait), self.session_bound, self.durable),
        )

    def parse(self, rows: Sequence[tuple]) -> Optional[LeaseSet]:  # type: ignore[override]
        if not rows:
            return None
        return LeaseSet(tuple(Lease(*row, self.durable) for row in rows))


def acquire_all_request(
    keys: Iterable[str], ttl: Seconds, owner: Optional[str], wait: Seconds, session_bound: bool, durable: bool
) -> AcquireAll:
    if isinstance(keys, str):
        raise TypeError("keys must be a list of keys, not a str")
    return AcquireAll("", ttl, owner, wait, session_bound, durable, keys=tuple(keys))


@dataclass(frozen=True)
class AcquireAny(Acquire):
    """lease_acquire_any's arguments: `key` is unused, `keys` the list, of which the first free one
    is granted (never waiting: `wait` is 0)."""

    keys: Tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return ", ".join(self.keys)

    def query(self, token: uuid.UUID) -> Query:
        return (
            "SELECT key, owner, fence, token, acquired_at, expires_at"
            " FROM fence.lease_acquire_any(%s, %s, %s, %s, %s, %s)",
            (list(self.keys), interval(self.ttl), self.owner, self.session_bound, self.durable, token),
        )

    def release_query(self, token: uuid.UUID) -> Query:
        """Releases whichever key of the list `token` may have been granted."""
        return (
            "SELECT coalesce(bool_or(fence.lease_release(key, %s)), false) FROM unnest(%s::text[]) AS key",
            (token, list(self.keys)),
        )


def acquire_any_request(
    keys: Iterable[str], ttl: Seconds, owner: Optional[str], session_bound: bool, durable: bool
) -> AcquireAny:
    if isinstance(keys, str):
        raise TypeError("keys must be a list of keys, not a str")
    keys = tuple(keys)
    if not keys:
        raise ValueError("keys must name at least one key")
    return AcquireAny("", ttl, owner, 0, session_bound, durable, keys=keys)


def release_query(key: str, token: uuid.UUID) -> Query:
    return ("SELECT fence.lease_release(%s, %s)", (key, token))


def give_up_query(request: Acquire, token: uuid.UUID) -> Query:
    """Releases whatever lease `token`, sent with `request`, may have been granted."""
    if isinstance(request, AcquireAny):
        return request.release_query(token)
    return release_query(request.key, token)


#: The most leases one lease_renew_many call renews (the server refuses more, 22023).
RENEW_MANY_LIMIT = 64


def renew_many_query(leases: Sequence[Lease], ttls: Sequence[float]) -> Query:
    """lease_renew_many of `leases`, each for its ttl in seconds, a row for each in order."""
    return (
        "SELECT key, token, expires_at FROM fence.lease_renew_many(%s::text[], %s::uuid[], %s::interval[])",
        ([lease.key for lease in leases], [lease.token for lease in leases], [interval(ttl) for ttl in ttls]),
    )


@dataclass(frozen=True)
class LeaseStatus:
    """fence.lease_status of a token: `state` "live" or "ended"; `reason` why it ended (the server's:
    released, expired, revoked, taken_over, session_ended, unknown), None while live; its `fence`
    and `expires_at` (None when the server knows nothing of the token), and the key's current fence."""

    state: str
    reason: Optional[str]
    fence: Optional[int]
    expires_at: Optional[datetime]
    current_fence: Optional[int]

    @property
    def live(self) -> bool:
        return self.state == "live"


def status_query(key: str, token: uuid.UUID) -> Query:
    return ("SELECT state, reason, fence, expires_at, current_fence FROM fence.lease_status(%s, %s)", (key, token))


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
