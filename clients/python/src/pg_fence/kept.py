"""What the sync and the asyncio kept lease share: reading the lease, judging it by its local
deadline, and telling the work once when it is lost. Each subclass sets `_holding` (holding.py),
`lost` (a threading or asyncio Event) and `_on_lost`, and stops its renewer in `_stop_renewing`."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Any, Dict, Iterator, Optional, Tuple

from .errors import LeaseLost, StaleFence
from .holding import HELD, LOST, RELEASED, UNKNOWN, Holding
from .lease import Lease, LeaseSet

log = logging.getLogger("pg_fence")


class Kept:
    _holding: Holding
    lost: Any
    _on_lost: Any

    @property
    def lease(self) -> Lease:
        return self._holding.lease

    @property
    def key(self) -> str:
        return self.lease.key

    @property
    def fence(self) -> int:
        return self.lease.fence

    @property
    def token(self) -> Any:
        return self.lease.token

    @property
    def state(self) -> str:
        """ "held", "lost" (the server said so), "unknown" (its deadline passed unconfirmed) or "released"."""
        if self._holding.state == HELD and self._holding.remaining() <= 0:
            self._declare(UNKNOWN)
        state = self._holding.state
        if state in (LOST, UNKNOWN):
            # Another thread may have declared the end and not yet set `lost`: whoever acts on
            # this state finds `lost` set, as it would be a moment later.
            self.lost.set()
        return state

    @property
    def deadline(self) -> float:
        """pg_fence.holding.clock() until which the lease is known to be held, short of a renewal."""
        return self._holding.deadline

    @property
    def lost_at(self) -> Optional[float]:
        """pg_fence.holding.clock() when the lease was declared lost or unknown."""
        return self._holding.lost_at

    @property
    def last_error(self) -> Optional[BaseException]:
        """The last failure of a renewal, for logs."""
        return self._holding.last_error

    def held(self) -> bool:
        return self.state == HELD

    def check(self) -> None:
        """Raises LeaseLost unless the lease is still held by its local deadline."""
        state = self.state
        if state != HELD:
            label = self._holding.lease.label
            raise LeaseLost(label, f"lease on {label!r} is {state}", state=state)

    @contextmanager
    def _fenced(self) -> Iterator[None]:
        """Around a fenced call under this lease: a local check first; the server's StaleFence
        means the lease is lost, whatever the keeper has heard yet."""
        self.check()
        try:
            yield
        except StaleFence:
            self._declare(LOST)
            raise

    def _stop_renewing(self) -> None:
        raise NotImplementedError

    def _released_as(self, answer: Optional[bool]) -> None:
        """Takes the outcome of the holder's release (Holding.released). A lease it leaves lost or
        unknown sets `lost`, but on_lost is not called: the holder has stopped using it."""
        self._holding.released(answer)
        if self._holding.state != RELEASED:
            self.lost.set()

    def _declare(self, state: str) -> None:
        if not self._holding.declare(state):
            return
        self.lost.set()
        self._stop_renewing()
        label = self._holding.lease.label
        log.warning("pg_fence: lease on %r %s", label, "lost" if state == LOST else "state unknown")
        if self._on_lost is not None:
            try:
                self._on_lost(self)
            except Exception:
                log.exception("pg_fence: on_lost callback failed")


class SetView:
    """What a kept lease set has instead of a kept lease's `key` and `fence`: its keys, and a fence
    per key. Its token, state, deadline, `lost` and release are a kept lease's, for the whole set."""

    _holding: Holding

    @property
    def lease_set(self) -> LeaseSet:
        lease_set = self._holding.lease
        assert isinstance(lease_set, LeaseSet)
        return lease_set

    @property
    def lease(self) -> LeaseSet:
        return self.lease_set

    @property
    def keys(self) -> Tuple[str, ...]:
        return self.lease_set.keys

    @property
    def fences(self) -> Dict[str, int]:
        return self.lease_set.fences

    @property
    def key(self) -> str:
        raise AttributeError("a lease set has keys, not a key")

    @property
    def fence(self) -> int:
        raise AttributeError("a lease set has a fence per key: fences[key]")

    def fence_of(self, key: str) -> int:
        """The fence of the set's lease on `key`; KeyError for a key outside the set."""
        fences = self.fences
        if key not in fences:
            raise KeyError(f"{key!r} is not a key of the set ({self.lease_set.label})")
        return fences[key]
