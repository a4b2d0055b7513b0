"""What the sync and the asyncio kept lease share: reading the lease, judging it by its local
deadline, and telling the work once when it is lost. Each subclass sets `_holding` (holding.py),
`lost` (a threading or asyncio Event) and `_on_lost`, and stops its renewer in `_stop_renewing`."""

from __future__ import annotations

import logging
from typing import Any, Dict, Iterable, Optional, Tuple

from .errors import LeaseLost
from .holding import HELD, LOST, RELEASED, UNKNOWN, Holding
from .lease import Lease, LeaseSet, Query
from .reasons import UNKNOWN as NO_REASON
from .reasons import LossReason, loss_reason

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
    def reason(self) -> Optional[LossReason]:
        """Why the lease was lost, with the state "lost" or "unknown" (pg_fence.reasons): `expired`,
        `revoked`, `taken_over`, `session_ended`, `restarted` (a fast lease lost in a crash or a
        failover), `unknown` (the server knows no more), or `unreachable` (its local deadline passed
        with no answer). A lease declared unknown learns at its release what became of it: its state
        is then "lost" with the server's reason, or "released" (reason None) when it was still live."""
        return self._holding.reason if self.state != HELD else None

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
            label, reason = self._holding.lease.label, self._holding.reason
            raise LeaseLost(label, f"lease on {label!r} is {state} ({reason})", state=state, reason=reason)

    def _stop_renewing(self) -> None:
        raise NotImplementedError

    def _status_query(self) -> Query:
        return self._holding.lease.status_query()

    def _reason_of(self, rows: Optional[Iterable[tuple]], otherwise: LossReason = NO_REASON) -> LossReason:
        """The loss reason lease_status's `rows` give (None: no answer came): `otherwise` when it
        gave none."""
        return otherwise if rows is None else loss_reason(rows, self._holding.lease.durable, otherwise)

    def _released_as(self, answer: Optional[bool], ended: Optional[str] = None) -> None:
        """Takes the outcome of the holder's release (Holding.released; `ended`, lease_status's
        reason after an answer of False). A lease it leaves lost or unknown sets `lost`, but on_lost
        is not called: the holder has stopped using it."""
        self._holding.released(answer, ended)
        if self._holding.state != RELEASED:
            self.lost.set()

    def _declare(self, state: str, reason: Optional[LossReason] = None) -> None:
        if not self._holding.declare(state, reason):
            return
        self.lost.set()
        self._stop_renewing()
        label = self._holding.lease.label
        told = "lost" if state == LOST else "state unknown"
        log.warning("pg_fence: lease on %r %s (%s)", label, told, self._holding.reason)
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
