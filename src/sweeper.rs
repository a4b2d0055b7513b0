//! fence.sweep(): ends expired leases, in a bounded batch per call. Correctness never depends on it
//! (an expired lease is free the moment it expires, judged by the clock); sweeping only marks such
//! leases free in the table and keeps the sweeper's figures. The background worker (src/worker.rs)
//! calls it every pg_fence.sweep_interval; without the worker, superusers and fence_admin call it
//! (or pg_cron does).
//!
//! A sweep must never make an acquirer wait: it holds the rows it swept until its transaction ends,
//! and the next grant of such a key would queue behind it. So it runs only in a transaction of its
//! own (not inside a transaction block), skips every row another transaction has locked, and takes
//! the one row of its figures first, without waiting (a sweep that finds it taken, by a concurrent
//! sweep, does nothing): it never waits for a lock while it holds lease rows.
use crate::notify::{self, Event};
use crate::spi_plans::execute;
use crate::{clock, durability, errors};
use pgrx::pg_sys::panic::ErrorReportable;
use pgrx::prelude::*;
use std::cell::Cell;

/// At most this many leases per call, so one sweep is one short transaction (milliseconds): an
/// acquirer whose row it has locked waits no longer than that. Rows another transaction has locked
/// are skipped, to be swept next time. The worker calls sweep() again at once while calls come back
/// full, so a backlog drains in a series of short transactions.
pub const BATCH: i64 = 1_000;

thread_local! {
    /// The table page where this backend's next sweep starts: each call goes on where the last one
    /// stopped (a TID range scan) instead of reading again past the rows it has just swept.
    static RESUME_AT_PAGE: Cell<i64> = const { Cell::new(0) };
}

/// Expired leases, and session-bound ones whose session has ended, from page $3 on; returns each
/// swept lease's key, fence and page.
const SWEEP: &str = concat!(
    "WITH expired AS (
        SELECT ctid FROM fence.lease_state
         WHERE ctid >= pg_catalog.format('(%s,0)', $3)::pg_catalog.tid
           AND token_hash IS NOT NULL AND NOT ",
    live_at!("$1"),
    " LIMIT $2 FOR UPDATE SKIP LOCKED)
    UPDATE fence.lease_state s SET token_hash = NULL
      FROM expired
     WHERE s.ctid = expired.ctid
    RETURNING s.key, s.fence, (expired.ctid::pg_catalog.text::pg_catalog.point)[0]::pg_catalog.int8"
);

/// The sweeper's figures, locked for this sweep unless another sweep holds them.
const CLAIM: &str = "SELECT 1 FROM fence.sweeper_stats FOR UPDATE SKIP LOCKED";

const RECORD: &str = "
    UPDATE fence.sweeper_stats SET last_run_at = $1, last_swept = $2, total_swept = total_swept + $2";

/// Marks up to 1,000 expired leases free (their fences untouched) and returns how many.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn sweep() -> i64 {
    durability::require_writable("sweep leases");
    // SAFETY: reads the backend's transaction state.
    if unsafe { pg_sys::IsTransactionBlock() } {
        errors::sweep_in_transaction_block();
    }
    let wal_before = durability::wal_position();
    if !execute(CLAIM, &[], |rows| !rows.is_empty()) {
        return 0; // another sweep is running
    }
    let now = clock::timestamp(clock::now());
    let args = [now.into(), BATCH.into(), RESUME_AT_PAGE.get().into()];
    let expired: Vec<(String, i64, i64)> = execute(SWEEP, &args, |rows| {
        rows.map(|row| {
            (
                row.get(1).unwrap_or_report().unwrap_or_default(),
                row.get(2).unwrap_or_report().unwrap_or_default(),
                row.get(3).unwrap_or_report().unwrap_or_default(),
            )
        })
        .collect()
    });
    for (key, fence, _) in &expired {
        notify::send(Event::Expired, key, *fence);
    }
    let swept = expired.len() as i64;
    // A full batch: go on from its last page next time. Fewer: the end of the table was reached;
    // start again from the beginning.
    let last_page = expired.iter().map(|(_, _, page)| *page).max().unwrap_or(0);
    RESUME_AT_PAGE.set(if swept == BATCH { last_page } else { 0 });
    execute(RECORD, &[now.into(), swept.into()], |_| ());
    // Nothing here needs to survive a crash: a lost sweep is swept again.
    durability::skip_flush_if_alone(wal_before);
    swept
}
