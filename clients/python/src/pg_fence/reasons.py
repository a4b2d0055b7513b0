"""Why a lease ended, as the clients tell it: the server's `fence.lease_status` after it said the
lease is not held (PF001, a stale fence, a release that found nothing), or `unreachable` when the
client's own deadline passed with no answer. Shared by the sync and the asyncio API.

The server cannot tell a fast (durable=False) lease lost in a crash or a failover from a token it
never saw: it says `unknown` for both. A client that acquired the lease fast knows which, and says
`restarted`."""

from __future__ import annotations

from typing import Iterable, Literal, Optional, Sequence

#: Why a kept lease was lost (its state "lost", or "unknown" for `unreachable`).
LossReason = Literal["expired", "revoked", "taken_over", "session_ended", "restarted", "unreachable", "unknown"]

EXPIRED: LossReason = "expired"
REVOKED: LossReason = "revoked"
TAKEN_OVER: LossReason = "taken_over"
SESSION_ENDED: LossReason = "session_ended"
RESTARTED: LossReason = "restarted"
UNREACHABLE: LossReason = "unreachable"
UNKNOWN: LossReason = "unknown"

#: What the server's lease_status says of a lease its holder's own release ended.
RELEASED = "released"

_SERVER_REASONS = {EXPIRED, REVOKED, TAKEN_OVER, SESSION_ENDED, RESTARTED, RELEASED}


def ended_reason(rows: Iterable[Sequence[Optional[object]]], durable: bool) -> Optional[str]:
    """The reason lease_status gives (rows of (state, reason, ...), a lease's one or a set's, in
    key order) for the first lease that ended: one of the loss reasons, or "released"; None when every
    one is live. `unknown` of a fast lease is `restarted`."""
    for state, reason, *_ in rows:
        if state != "ended":
            continue
        if reason in _SERVER_REASONS:
            return str(reason)
        return UNKNOWN if durable else RESTARTED
    return None


def loss_reason(rows: Iterable[Sequence[Optional[object]]], durable: bool, live: LossReason) -> LossReason:
    """ended_reason for a lease its holder did not end: `live` when the server still counts it live
    (a session-bound lease whose session we lost lives on in it); a release by someone else with
    our token is no reason we know of, `unknown`."""
    reason = ended_reason(rows, durable)
    if reason is None:
        return live
    return UNKNOWN if reason == RELEASED else reason  # type: ignore[return-value]
