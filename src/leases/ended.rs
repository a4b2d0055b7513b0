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
use super::row::{self, Found};
use super::token_hash;
use crate::pg::{clock, input};
use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;
use pgrx::Uuid;

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

/// What lease_status reports of a token's lease.
struct Status {
    state: &'static str,
    reason: Option<String>,
    fence: Option<i64>,
    expires_at: Option<i64>,
}

/// The lease `hash` holds or held among the key's rows, as they were last committed.
fn status_of(rows: &[Found], hash: &[u8], current: Option<i64>) -> Status {
    let taken_over = |reason: &str, fence: i64| {
        if reason == "expired" && current.is_some_and(|current| current > fence) {
            "taken_over".to_string()
        } else {
            reason.to_string()
        }
    };
    for found in rows {
        if found.token_hash.as_deref() == Some(hash) {
            let Some(live) = &found.live else {
                // A session's end is not known until recorded (see `session_end_unrecorded`).
                let (reason, ended_at) = if found.session_gone {
                    ("session_ended", None)
                } else {
                    ("expired", Some(found.expires_at))
                };
                return Status {
                    state: "ended",
                    reason: Some(taken_over(reason, found.fence)),
                    fence: Some(found.fence),
                    expires_at: ended_at,
                };
            };
            return Status {
                state: "live",
                reason: None,
                fence: Some(live.fence),
                expires_at: Some(live.expires_at),
            };
        }
        if let Some(ended) = found.ended.as_ref().filter(|ended| ended.token_hash == hash) {
            return Status {
                state: "ended",
                reason: Some(taken_over(&ended.reason, ended.fence)),
                fence: Some(ended.fence),
                expires_at: Some(ended.at),
            };
        }
    }
    Status { state: "ended", reason: Some("unknown".into()), fence: None, expires_at: None }
}

/// Whether `token`'s lease on `key` is live, or why it ended: one row (state, reason, fence,
/// expires_at, current_fence). Reads the latest committed state; changes nothing.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
#[allow(clippy::type_complexity)]
fn lease_status(
    key: Option<&str>,
    token: Option<Uuid>,
) -> TableIterator<
    'static,
    (
        name!(state, String),
        name!(reason, Option<String>),
        name!(fence, Option<i64>),
        name!(expires_at, Option<TimestampWithTimeZone>),
        name!(current_fence, Option<i64>),
    ),
> {
    let key = input::key(key);
    let token = input::required(token, "token");
    let rows = row::all_with_ends(key, clock::now());
    let current = rows.iter().map(|found| found.fence).max();
    let status = status_of(&rows, &token_hash(token), current);
    TableIterator::once((
        status.state.to_string(),
        status.reason,
        status.fence,
        status.expires_at.map(clock::timestamp),
        current,
    ))
}
