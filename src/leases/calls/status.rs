//! What a caller may ask of a key without changing it: its last fence (current_fence), and whether
//! a token's lease is live or why it ended (lease_status; see `state::ended`).
use crate::leases::state::found::Found;
use crate::leases::state::kinds::Kind;
use crate::leases::state::token::token_hash;
use crate::leases::state::{memory, rows};
use crate::pg::spi_plans::execute_first;
use crate::pg::{clock, input};
use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;
use pgrx::Uuid;

/// The key's last fence: of its durable rows, or of both kinds' where fast leases can be read (see
/// `Kind::table`).
const CURRENT_FENCE: &str = "SELECT max(fence) FROM fence.lease_state WHERE key = $1";
const CURRENT_FENCE_OF_BOTH: &str = "SELECT greatest((SELECT max(fence) FROM fence.lease_state WHERE key = $1),
                                                 (SELECT max(fence) FROM fence.fast_lease_state WHERE key = $1))";

/// The last fence granted for `key`; NULL if it was never granted, or its lease ended more than
/// pg_fence.retain_ended ago and the sweep has deleted its row.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn current_fence(key: Option<&str>) -> Option<i64> {
    let key = input::key(key);
    if memory::changes::in_use() {
        let in_table = execute_first::<i64>(CURRENT_FENCE, &[key.into()]);
        return in_table.max(memory::changes::last_fence(key));
    }
    let statement = if Kind::Fast.table().is_some() { CURRENT_FENCE_OF_BOTH } else { CURRENT_FENCE };
    execute_first::<i64>(statement, &[key.into()])
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
    let rows = rows::all_with_ends(key, clock::now());
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
