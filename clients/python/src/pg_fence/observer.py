"""The hook metrics observe a client by: an Observer, given to Client(..., observer=...) (and
pg_fence.aio's), is told of its acquires and renewals with how long they took, of kept leases
starting and ending, of losses with their reason, and of leaderships gained and lost.
pg_fence.prometheus has one for prometheus_client; the client itself needs no metrics library."""

from __future__ import annotations

import logging
import time
from typing import Any, Optional

log = logging.getLogger("pg_fence")

#: How an acquire ended: the lease granted, the key held by others (after the wait), or an error.
GRANTED, REFUSED, ERROR = "granted", "refused", "error"
#: How a renewal call ended: every lease renewed, one or more found lost, or the call failed.
RENEW_OK, RENEW_LOST, RENEW_ERROR = "ok", "lost", "error"


class Observer:
    """Every method does nothing: override those you need. They are called on the thread (or in
    the task) that did the work, the keeper's included, so they must be thread-safe, short, and
    never block; one that raises is logged and the client goes on."""

    def acquire_finished(self, seconds: float, outcome: str) -> None:
        """An acquire ended (acquire, acquire_all, acquire_first_free, and the acquire of every
        kept lease: lease, lease_set, lease_first_free, an elector's campaign), retries and the
        wait included; `outcome` is GRANTED, REFUSED or ERROR."""

    def renew_finished(self, seconds: float, outcome: str, leases: int) -> None:
        """A renewal call of kept leases ended: one lease_renew_many of the client's keeper
        (`leases`: how many it renewed), or one renewal of a session-bound lease or a set
        (`leases`: 1); `outcome` is RENEW_OK, RENEW_LOST or RENEW_ERROR."""

    def kept_lease_started(self, lease: Any) -> None:
        """A kept lease (KeptLease, KeptLeaseSet, Leadership) was granted and is kept from now on."""

    def kept_lease_ended(self, lease: Any) -> None:
        """A kept lease is kept no more (lost, released, handed off, or left to expire): once,
        after kept_lease_started."""

    def lease_lost(self, lease: Any, reason: str) -> None:
        """A kept lease was lost while held (as on_lost is told), or its holder's release found it
        lost already; `reason` as reasons.py names it (expired, revoked, taken_over, ...)."""

    def leadership_gained(self, election: str) -> None:
        """An elector of this client won its campaign; `election` is its key."""

    def leadership_lost(self, election: str) -> None:
        """A leadership that was gained ended: once, after leadership_gained."""


def tell(observer: Optional[Observer], method: str, *args: Any) -> None:
    """Calls `observer`'s `method`, if there is an observer; its failure is its own."""
    if observer is None:
        return
    try:
        getattr(observer, method)(*args)
    except Exception:
        log.exception("pg_fence: observer's %s failed", method)


class Timed:
    """Times a call for `observer` (`with Timed(observer, "acquire") as timed: timed.outcome = ...`):
    told at the end with the outcome set meanwhile, ERROR when the block raised."""

    def __init__(self, observer: Optional[Observer], method: str, *extra: Any):
        self.observer = observer
        self.method = method
        self.extra = extra
        self.outcome: Optional[str] = None

    def __enter__(self) -> "Timed":
        self.start = time.monotonic()
        return self

    def granted(self, held: Any) -> Any:
        """Sets the acquire's outcome by what it returned, and returns that."""
        self.outcome = REFUSED if held is None else GRANTED
        return held

    def __exit__(self, kind: Any, *exc: object) -> None:
        outcome = self.outcome if kind is None and self.outcome is not None else ERROR
        tell(self.observer, self.method, time.monotonic() - self.start, outcome, *self.extra)
