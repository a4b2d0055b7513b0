"""pg_fence's failures as Python types, and which of psycopg's errors mean what.

psycopg knows PF001 and PF002 only as ProgrammingError, and reports an acquire's wait ended by the
server (57014, 55P03) and a dropped connection both as OperationalError; a caller must treat them
differently:
- LeaseLost, StaleFence: the server said so; stop the work done under that lease.
- WaitTimedOut, WaitCancelled: the acquire did not grant; nothing is held.
- OutcomeUnknown: the connection broke while the call was in flight, and retries ran out; the
  server may or may not have done it.
- ConnectFailed: no connection could be made, and retries ran out; nothing reached the server.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional

import psycopg


class PgFenceError(Exception):
    """Base of every error this package raises itself."""


class LeaseLost(PgFenceError):
    """The lease is no longer held: the server said so (PF001), or it was declared lost locally."""

    def __init__(self, key: str, message: str = "", *, state: str = "lost", reason: Optional[str] = None):
        super().__init__(message or f"lease on {key!r} lost")
        self.key = key
        #: "lost" when the server said so, "unknown" when its deadline passed unconfirmed.
        self.state = state
        #: Why (pg_fence.reasons): from a kept lease, its reason; from Client.renew, what the
        #: server's lease_status said; None from the plain calls, which send one statement each.
        self.reason = reason


class StaleFence(PgFenceError):
    """A write under a fence that is no longer the key's live one was refused (PF002)."""


class WaitTimedOut(PgFenceError):
    """An acquire did not get the lease within its wait (or at once, with no wait)."""


class WaitCancelled(PgFenceError):
    """A waiting acquire was cancelled or hit statement_timeout (57014), or lock_timeout while queued
    behind other waiters (55P03); it granted nothing. `sqlstate` says which."""

    def __init__(self, message: str, sqlstate: Optional[str] = None):
        super().__init__(message)
        self.sqlstate = sqlstate


class OutcomeUnknown(PgFenceError):
    """The connection broke during the call and retries ran out: it may or may not have happened.
    `token`, for an acquire, is the token it sent: acquire again with it to get the lease if it
    was granted, or release with it."""

    token = None


class ConnectFailed(PgFenceError):
    """No connection could be made (refused, unreachable, a pool with none to give): nothing was
    sent. The error from psycopg is the cause."""


@contextmanager
def connecting() -> Iterator[None]:
    """Around the making (or taking from a pool) of a connection, whose failure sent nothing."""
    try:
        yield
    except psycopg.OperationalError as err:
        raise ConnectFailed(f"could not connect: {str(err).strip()}") from err


class CallTimedOut(TimeoutError):
    """A call got no answer within its time limit; it may or may not have happened."""


LEASE_LOST = "PF001"
STALE_FENCE = "PF002"
QUERY_CANCELED = "57014"
LOCK_NOT_AVAILABLE = "55P03"
READ_ONLY = "25006"


def sqlstate(err: BaseException) -> Optional[str]:
    return getattr(err, "sqlstate", None) if isinstance(err, psycopg.Error) else None


def outcome_unknown(err: BaseException) -> bool:
    """Whether `err` leaves it open what the server did: the connection, not the statement, failed."""
    if isinstance(err, (OSError, TimeoutError)):
        return True
    if not isinstance(err, psycopg.OperationalError):
        # Errors raised before anything was sent (a NUL byte in a string, a closed connection)
        # and errors of the statement itself leave nothing open.
        return False
    state = sqlstate(err)
    # 08: connection exceptions; 57P01, 57P02: the server shut down or crashed under us.
    return state is None or state.startswith("08") or state in ("57P01", "57P02")


def retryable(err: BaseException) -> bool:
    """Whether trying again (on a new connection) can succeed: a broken connection, none made, a
    server starting up (57P03), or a standby reached where the primary was meant (25006, as after
    a failover)."""
    return (
        outcome_unknown(err)
        or isinstance(err, ConnectFailed)
        or sqlstate(err) in (READ_ONLY, "57P03")
        or (isinstance(err, psycopg.InterfaceError) and "closed" in str(err))
    )


def translate(err: BaseException, key: str, *, waiting: bool = False) -> BaseException:
    """pg_fence's own SQLSTATEs as their types (57014 and 55P03 as WaitCancelled only for a
    `waiting` acquire); every other error as it is."""
    state = sqlstate(err)
    if state == LEASE_LOST:
        return LeaseLost(key, str(err).strip())
    if state == STALE_FENCE:
        return StaleFence(str(err).strip())
    if state in (QUERY_CANCELED, LOCK_NOT_AVAILABLE) and waiting:
        return WaitCancelled(str(err).strip(), state)
    return err
