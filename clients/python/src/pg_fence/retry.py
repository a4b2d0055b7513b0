"""Exponential backoff with full jitter: each pause is uniform in [0, min(cap, base * 2**attempt)],
which spreads out clients that failed together (a restart, a failover) instead of having them come
back in lockstep."""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional

from .errors import OutcomeUnknown, outcome_unknown, retryable


@dataclass(frozen=True)
class Retry:
    """How often and how long to try again after a broken connection. By default `total` is the
    bound: retries go on for 15 s after a call's first failure, which a restart or a failover of
    several seconds fits in."""

    #: Tries at most, the first included (None: as many as `total` allows).
    attempts: Optional[int] = None
    base: float = 0.05
    cap: float = 2.0
    #: Give up once this many seconds have passed since the call's first failure (None: attempts
    #: only). Counted from the failure, not from the call: an acquire that waited on the server
    #: longer than this still gets its retries when its connection then breaks.
    total: Optional[float] = 15.0

    def pause(self, attempt: int) -> float:
        """The pause before retry number `attempt` (0 for the first retry)."""
        # The exponent is bounded: past the cap it changes nothing, and a float overflows.
        return random.uniform(0.0, min(self.cap, self.base * (2 ** min(attempt, 64))))

    def pauses(self, end: Optional[float] = None) -> Iterator[float]:
        """The pauses between tries, stopping when attempts run out or a pause would end past
        `total` seconds from now, or past `end` (time.monotonic())."""
        if self.total is not None:
            by_total = time.monotonic() + self.total
            end = by_total if end is None else min(end, by_total)
        attempts: Iterable[int] = itertools.count() if self.attempts is None else range(self.attempts - 1)
        return self._pauses(attempts, end)

    def _pauses(self, attempts: Iterable[int], end: Optional[float]) -> Iterator[float]:
        for attempt in attempts:
            pause = self.pause(attempt)
            if end is not None and time.monotonic() + pause > end:
                return
            yield pause


NO_RETRY = Retry(attempts=1)


class Tries:
    """The tries of one call: the pause before each retry, the time each try may take, and what to
    raise when they run out."""

    def __init__(self, retry: Retry, end: Optional[float] = None, resend: bool = True):
        self._retry = retry
        # Made at the first failure, so that `total` counts from there.
        self._pauses: Optional[Iterator[float]] = None
        self._end = end
        # Whether a try that may have taken effect may be sent again. Not for lease_acquire_all,
        # which takes no token: a second try could not get back a set the first one was granted.
        self._resend = resend
        # Whether a try failed in a way that leaves it open what the server did: then running out
        # of retries leaves the call's outcome unknown, even if the later tries never connected.
        self._unsure = False

    def limit(self, limit: Optional[float]) -> Optional[float]:
        """How long the next try may take: `limit` (None: no limit), and no later than `end`."""
        if self._end is None:
            return limit
        left = max(0.0, self._end - time.monotonic())
        return left if limit is None else min(limit, left)

    def pause_or_raise(self, err: Exception) -> float:
        """The pause before trying again after `err`, or raises: `err` itself when trying again
        cannot help or nothing reached the server, OutcomeUnknown when the tries ran out after one
        that may have taken effect."""
        self._unsure = self._unsure or outcome_unknown(err)
        if self._unsure and not self._resend:
            raise OutcomeUnknown(f"connection failed mid-call, which is not sent again: {err}") from err
        if self._pauses is None:
            self._pauses = self._retry.pauses(self._end)
        pause = next(self._pauses, None) if retryable(err) else None
        if pause is not None:
            return pause
        if retryable(err) and self._unsure:
            raise OutcomeUnknown(f"connection failed and retries ran out: {err}") from err
        raise err
