//! Why a lease ended (lease_status), and the lock-delay an end that is not a release sets.
//!
//! A row records the last lease of its slot that ended, in the statement that ends it: its token's
//! hash, fence, moment and reason. `released` (lease_release, and the old holder of a hand-off),
//! `revoked` (lease_revoke), and for a lease that ended without a call, `expired` or
//! `session_ended`, recorded by whichever statement next touches its row (a grant, the sweep).
//! Until then its row still holds its token, and the reason is read from the row itself. An expired
//! lease whose key has been granted again since is `taken_over`. No path writes or flushes more than
//! it did: the record is part of the UPDATE that ends the lease.
//!
//! Lock-delay: a lease acquired with `lock_delay` that ends other than by a release (it expires, is
//! revoked, or its session ends) keeps every grant of its key back until `lock_delay` after its end.
//! The end of a session is known only once it is seen: the sweep records it, a waiting acquire
//! counts from when it first saw it, and an acquire that remembers nothing from the lease's expiry.
//! Each is at or after the real end: never a shorter delay.
use super::found::Found;

/// SET items recording the end of the row's lease (`$reason` an SQL expression, `$at` when).
/// The right-hand sides read the row as it was before the UPDATE.
macro_rules! record_end {
    ($reason:expr, $at:expr) => {
        concat!(
            "ended_hash = token_hash, ended_fence = fence, ended_at = ",
            $at,
            ", ended_reason = ",
            $reason
        )
    };
}

/// Why an unreleased lease found dead at `$now` ended: its session, while it had time left, or
/// its expiry.
macro_rules! involuntary_end {
    ($now:literal) => {
        concat!("CASE WHEN expires_at > ", $now, " THEN 'session_ended' ELSE 'expired' END")
    };
}

/// Until when the key's rows keep a grant back by a lock-delay, at `now`; `first_seen(row)` stands
/// for the end of a session-bound lease whose session was seen gone but whose end nobody recorded
/// yet (the caller's first sight of it). None when nothing holds the key back.
pub fn held_back_until(rows: &[Found], now: i64, first_seen: impl Fn(&Found) -> i64) -> Option<i64> {
    rows.iter()
        .filter(|found| found.lock_delay > 0 && found.live.is_none())
        .filter_map(|found| Some(end_of(found, &first_seen)? + found.lock_delay))
        .filter(|until| *until > now)
        .max()
}

/// When a dead lease ended, if its end was not a release.
fn end_of(found: &Found, first_seen: &impl Fn(&Found) -> i64) -> Option<i64> {
    if found.unreleased {
        return Some(if found.session_gone {
            first_seen(found).min(found.expires_at)
        } else {
            found.expires_at
        });
    }
    let ended = found.ended.as_ref().filter(|ended| ended.fence == found.fence)?;
    (ended.reason != "released").then_some(ended.at)
}

/// Whether a row holds a session-bound lease whose session is gone, with time left and a
/// lock-delay: its end is known only from when it is seen.
pub fn session_end_unrecorded(found: &Found) -> bool {
    found.unreleased && found.session_gone && found.lock_delay > 0
}
