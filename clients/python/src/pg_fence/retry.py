"""Exponential backoff with full jitter: each pause is uniform in [0, min(cap, base * 2**attempt)],
which spreads out clients that failed together (a restart, a failover) instead of having them come
back in lockstep."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Iterator, Optional

from .errors import OutcomeUnknown, outcome_unknown, retryable


@dataclass(frozen=True)
class Retry:
    """How often and how long to try again after a broken connection."""

    attempts: int = 6
    base: float = 0.05
    cap: float = 2.0
    #: Give up once this many seconds have passed since the first try (None: attempts only).
    total: Optional[float] = 15.0

    def pause(self, attempt: int) -> float:
        """The pause before retry number `attempt` (0 for the first retry)."""
        return random.uniform(0.0, min(self.cap, self.base * (2**attempt)))

    def pauses(self) -> Iterator[float]:
        """The pauses between tries, stopping when attempts or the total time run out."""
        started = time.monotonic()
        for attempt in range(self.attempts - 1):
            pause = self.pause(attempt)
            if self.total is not None and time.monotonic() + pause - started > self.total:
                return
            yield pause


NO_RETRY = Retry(attempts=1)


def pause_or_raise(err: Exception, pauses: Iterator[float]) -> float:
    """The pause before trying again after `err`, or raises: `err` itself when trying again cannot
    help, OutcomeUnknown when the tries ran out on a broken connection."""
    pause = next(pauses, None) if retryable(err) else None
    if pause is not None:
        return pause
    if retryable(err) and outcome_unknown(err):
        raise OutcomeUnknown(f"connection failed and retries ran out: {err}") from err
    raise err
