//! Why a lease ended, as the client tells it: what the server's `fence.lease_status` says once the
//! server said the lease is not held (PF001, a release that found nothing), or `Unreachable` when the
//! client's own deadline passed with no answer.
//!
//! The server cannot tell a fast (`durable(false)`) lease lost in a crash or a failover from a token
//! it never saw: it says `unknown` for both. A client that acquired the lease fast knows which, and
//! says `Restarted`.
use std::fmt;

/// Why a held lease was lost (`LeaseState::Lost`, `Error::LeaseLost`; `Unreachable` is the reason of
/// `LeaseState::Unknown`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LossReason {
    /// Its TTL ran out without a renewal, and nobody has taken the key since.
    Expired,
    /// `fence.lease_revoke` ended it.
    Revoked,
    /// Its TTL ran out and another holder was granted the key.
    TakenOver,
    /// A session-bound lease whose session ended (or was lost to this client).
    SessionEnded,
    /// A fast lease lost in a crash or a failover of the server.
    Restarted,
    /// The local deadline passed without an answer from the server: it may still count the lease
    /// live, for a moment.
    Unreachable,
    /// The server knows no more (the lease's row is gone).
    Unknown,
}

impl LossReason {
    /// The name the server and both clients use: `expired`, `revoked`, `taken_over`,
    /// `session_ended`, `restarted`, `unreachable`, `unknown`.
    pub fn as_str(&self) -> &'static str {
        match self {
            LossReason::Expired => "expired",
            LossReason::Revoked => "revoked",
            LossReason::TakenOver => "taken_over",
            LossReason::SessionEnded => "session_ended",
            LossReason::Restarted => "restarted",
            LossReason::Unreachable => "unreachable",
            LossReason::Unknown => "unknown",
        }
    }
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the server says a lease ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Released with its token (by its holder: an earlier try of a release whose answer was lost).
    Released,
    Lost(LossReason),
}

impl Ended {
    /// The reason of a lease its holder did not release: a release by someone else with its token is
    /// no reason we know of.
    pub fn loss(self) -> LossReason {
        match self {
            Ended::Released => LossReason::Unknown,
            Ended::Lost(reason) => reason,
        }
    }
}

/// How the first lease that ended ended, of `rows` of lease_status's (state, reason): a lease's one,
/// or a set's in key order; None when every one is live. `unknown` of a fast lease is `Restarted`.
pub(crate) fn ended<'a>(
    rows: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
    durable: bool,
) -> Option<Ended> {
    let (_, reason) = rows.into_iter().find(|(state, _)| *state == "ended")?;
    Some(match reason {
        Some("released") => Ended::Released,
        Some("expired") => Ended::Lost(LossReason::Expired),
        Some("revoked") => Ended::Lost(LossReason::Revoked),
        Some("taken_over") => Ended::Lost(LossReason::TakenOver),
        Some("session_ended") => Ended::Lost(LossReason::SessionEnded),
        Some("restarted") => Ended::Lost(LossReason::Restarted),
        _ if durable => Ended::Lost(LossReason::Unknown),
        _ => Ended::Lost(LossReason::Restarted),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_servers_reasons_and_a_fast_lease_the_server_forgot() {
        let one = |state, reason, durable| ended([(state, reason)], durable);
        assert_eq!(one("live", None, true), None);
        assert_eq!(one("ended", Some("revoked"), true), Some(Ended::Lost(LossReason::Revoked)));
        assert_eq!(one("ended", Some("taken_over"), false), Some(Ended::Lost(LossReason::TakenOver)));
        assert_eq!(one("ended", Some("unknown"), true), Some(Ended::Lost(LossReason::Unknown)));
        assert_eq!(one("ended", Some("unknown"), false), Some(Ended::Lost(LossReason::Restarted)));
        assert_eq!(one("ended", Some("released"), true).map(Ended::loss), Some(LossReason::Unknown));
        let set = [("live", None), ("ended", Some("expired")), ("ended", Some("revoked"))];
        assert_eq!(ended(set, true), Some(Ended::Lost(LossReason::Expired)), "the first that ended");
    }
}
