//! fence.sweep(): ends expired leases, in a bounded batch per call. Correctness never depends on it
//! (an expired lease is free the moment it expires, judged by the clock); sweeping only marks such
//! leases free in the table and keeps the sweeper's figures. The background worker (src/worker.rs)
//! calls it every pg_fence.sweep_interval; without the worker, call it yourself (or from pg_cron).
use crate::notify::{self, Event};
use crate::spi_plans::execute;
use crate::{clock, durability};
use pgrx::pg_sys::panic::ErrorReportable;
use pgrx::prelude::*;

/// At most this many leases per call, so one sweep is one short transaction that holds up no
/// acquirer for long; rows another transaction has locked are skipped, to be swept next time.
const BATCH: i64 = 10_000;

/// Expired leases, and session-bound ones whose session has ended.
const SWEEP: &str = concat!(
    "WITH expired AS (
        SELECT ctid FROM fence.lease_state
         WHERE token_hash IS NOT NULL AND NOT ",
    live_at!("$1"),
    " LIMIT $2 FOR UPDATE SKIP LOCKED)
    UPDATE fence.lease_state s SET token_hash = NULL
      FROM expired
     WHERE s.ctid = expired.ctid
    RETURNING s.key, s.fence"
);

const RECORD: &str = "
    UPDATE fence.sweeper_stats SET last_run_at = $1, last_swept = $2, total_swept = total_swept + $2";

/// Marks up to 10,000 expired leases free (their fences untouched) and returns how many.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn sweep() -> i64 {
    durability::require_writable("sweep leases");
    let wal_before = durability::wal_position();
    let now = clock::timestamp(clock::now());
    let expired: Vec<(String, i64)> = execute(SWEEP, &[now.into(), BATCH.into()], |rows| {
        rows.map(|row| {
            (
                row.get(1).unwrap_or_report().unwrap_or_default(),
                row.get(2).unwrap_or_report().unwrap_or_default(),
            )
        })
        .collect()
    });
    for (key, fence) in &expired {
        notify::send(Event::Expired, key, *fence);
    }
    let swept = expired.len() as i64;
    execute(RECORD, &[now.into(), swept.into()], |_| ());
    // Nothing here needs to survive a crash: a lost sweep is swept again.
    durability::skip_flush_if_alone(wal_before);
    swept
}
