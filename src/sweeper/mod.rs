//! fence.sweep(): ends expired leases and deletes the rows of long-ended ones, in a bounded batch
//! per call. Correctness never depends on it (an expired lease is free the moment it expires,
//! judged by the clock; a key without a row is granted above every fence it had, see
//! `leases::state::fences`); sweeping marks such leases free, keeps the table to the keys in use
//! (pg_fence.retain_ended) and keeps the sweeper's figures. The background worker (`worker`,
//! started by `launcher` while its database exists) calls it every pg_fence.sweep_interval, and
//! bounds how long a guard may hold back a grant (`overrun`, pg_fence.guard_timeout); without the
//! worker, superusers and fence_admin call it (or pg_cron does).
//!
//! A sweep must make no acquirer wait longer than its own short transaction: it holds the rows it
//! swept until its transaction ends, and the next grant of such a key queues behind it. So it runs
//! only in a transaction of its own (not inside a transaction block), skips every row another
//! transaction has locked, and takes the one row of its figures first, without waiting (a sweep
//! that finds it taken, by a concurrent sweep, does nothing): it never waits for a lock while it
//! holds lease rows.
//!
//! Uses leases/ (`state`, and `line::notify`), locks/, stats and pg/; nothing depends on it but
//! `_PG_init`, which registers its launcher.
pub mod launcher;
mod overrun;
pub mod worker;

use crate::leases::line::notify::{self, Event};
use crate::leases::state::durability;
use crate::leases::state::kinds::Kind;
use crate::leases::state::memory;
use crate::leases::state::mode::LeaseMode;
use crate::leases::state::slots;
use crate::locks::sweeps;
use crate::pg::clock;
use crate::pg::errors;
use crate::pg::installed;
use crate::pg::settings;
use crate::pg::spi_plans::execute;
use crate::stats::{self, Counter};
use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys::panic::ErrorReportable;
use pgrx::prelude::*;
use std::cell::Cell;

/// At most this many leases per call, so one sweep is one short transaction (milliseconds): an
/// acquirer whose row it has locked waits no longer than that. Rows another transaction has locked
/// are skipped, to be swept next time. The worker calls sweep() again at once while calls come back
/// full, so a backlog drains in a series of short transactions. A sweep of fast leases' rows in
/// shared memory holds two locks per key until it commits (the key's and its sweep mark, see
/// `locks::sweeps`): 500 keeps it to a thousand locks of the shared lock table.
pub const BATCH: i64 = 500;

thread_local! {
    /// The page of each lease table (durable, fast) where this backend's next sweep starts: each
    /// call goes on where the last one stopped (a TID range scan) instead of reading again past the
    /// rows it has just swept.
    static RESUME_AT_PAGE: [Cell<i64>; 2] = const { [Cell::new(0), Cell::new(0)] };
    /// The same for the fast leases in shared memory: a bucket of its table.
    static RESUME_AT_BUCKET: Cell<usize> = const { Cell::new(0) };
}

/// In one lease table, from page $3 on, up to $2 rows to tidy, skipping rows another transaction has locked: leases
/// that have ended by $1 without being released (expired, or session-bound ones whose session has
/// ended), which it marks ended (ended at $1 at the latest); and rows of leases that ended before
/// $4 (pg_fence.retain_ended ago; NULL: keep them all), which it returns to be deleted once no writer
/// under them is left (`slots::writers_done`), locked. Returns each row's key, fence, page, whether it is to be deleted, its
/// slot and mode, and its ctid.
macro_rules! sweep {
    ($table:literal) => {
        sweep!(
            $table,
            concat!(", ", record_end!(involuntary_end!("$1"), "least(s.expires_at, $1)")),
            // A row whose lock-delay runs on keeps the key back (see `leases::ended`).
            " AND (lock_delay = 0 OR expires_at + lock_delay * interval '1 microsecond' < $1)",
            "slot AS c_slot, shared AS c_shared, permits AS c_permits"
        )
    };
    ($table:literal, before_0_5_0) => {
        // Every lease of these versions is exclusive, in slot 0.
        sweep!($table, "", "", "0 AS c_slot, false AS c_shared, 1 AS c_permits")
    };
    ($table:literal, $record:expr, $delayed:expr, $mode:expr) => {
        concat!(
            "WITH candidate AS (
        SELECT ctid, key AS c_key, fence AS c_fence, token_hash IS NULL AS ended, ",
            $mode,
            " FROM ",
            $table,
            "
         WHERE ctid >= pg_catalog.format('(%s,0)', $3)::pg_catalog.tid AND key <> ''
           AND ((token_hash IS NOT NULL AND NOT ",
            live_at!("$1"),
            ") OR (token_hash IS NULL AND expires_at < $4",
            $delayed,
            "))
         LIMIT $2 FOR UPDATE SKIP LOCKED),
    marked AS (
        UPDATE ",
            $table,
            " s SET token_hash = NULL, expires_at = least(s.expires_at, $1)",
            $record,
            "
          FROM candidate c
         WHERE s.ctid = c.ctid AND NOT c.ended
        RETURNING s.key, s.fence, c.ctid, c.c_slot, c.c_shared, c.c_permits)
    SELECT key, fence, (ctid::pg_catalog.text::pg_catalog.point)[0]::pg_catalog.int8, to_delete,
           c_slot, c_shared, c_permits, ctid::pg_catalog.text
      FROM (SELECT key, fence, ctid, false AS to_delete, c_slot, c_shared, c_permits FROM marked
            UNION ALL
            SELECT c_key, c_fence, ctid, true, c_slot, c_shared, c_permits FROM candidate WHERE ended) changed"
        )
    };
}

/// Deletes the rows of one lease table at these ctids (text), which this sweep has locked.
macro_rules! delete_rows {
    ($table:literal) => {
        concat!("DELETE FROM ", $table, " WHERE ctid = ANY ($1::pg_catalog.text[]::pg_catalog.tid[])")
    };
    ($table:literal, before_0_5_0) => {
        delete_rows!($table)
    };
}

/// Raises the high-water mark of deleted fences (see `leases::state::fences`) in the deleting transaction.
/// All fast reservations but the highest, which alone counts (see `leases::state::fences`).
const TRIM_FAST_RESERVE: &str = "
    DELETE FROM fence.fast_reserve WHERE ctid IN (
        SELECT ctid FROM fence.fast_reserve
         WHERE fence < (SELECT max(fence) FROM fence.fast_reserve) FOR UPDATE SKIP LOCKED)";

/// The sweeper's figures, locked for this sweep unless another sweep holds them.
const CLAIM: &str = "SELECT 1 FROM fence.sweeper_stats FOR UPDATE SKIP LOCKED";

const RECORD: &str = "
    UPDATE fence.sweeper_stats
       SET last_run_at = $1, last_swept = $2, total_swept = total_swept + $2, total_deleted = total_deleted + $3";

/// The same over the objects of a version before 0.4.0, which keep no count of deletions (and
/// delete nothing).
const RECORD_BEFORE_0_4_0: &str = "
    UPDATE fence.sweeper_stats SET last_run_at = $1, last_swept = $2, total_swept = total_swept + $2";

/// Marks expired leases ended (their fences untouched) and deletes the rows of leases that ended
/// more than pg_fence.retain_ended ago, `BATCH` rows at most; returns how many rows it changed.
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
    let now = clock::now();
    let since_0_4_0 = installed::since_0_4_0();
    let delete_before =
        since_0_4_0.then(|| clock::timestamp(now.saturating_sub(settings::retain_ended_micros())));
    let mut rows = sweep_table(Kind::Durable, now, BATCH, delete_before);
    if since_0_4_0 {
        let limit = BATCH - rows.len() as i64;
        if memory::changes::in_use() {
            rows.extend(sweep_memory(
                now,
                limit,
                delete_before.map(|_| now.saturating_sub(settings::retain_ended_micros())),
            ));
        } else {
            rows.extend(sweep_table(Kind::Fast, now, limit, delete_before));
        }
    }
    let (deleted, ended): (Vec<_>, Vec<_>) = rows.iter().partition(|(_, _, deleted)| *deleted);
    for (key, fence, _) in &ended {
        notify::send(Event::Expired, key, *fence);
    }
    stats::add(Counter::ExpiriesSwept, ended.len() as u64);
    if let Some(highest) = deleted.iter().map(|(_, fence, _)| *fence).max() {
        crate::leases::state::high_water::raise(highest);
    }
    if installed::table(c"fast_reserve").is_some() {
        execute(TRIM_FAST_RESERVE, &[], |_| ());
    }
    let changed = rows.len() as i64;
    let record = [clock::timestamp(now).into(), (ended.len() as i64).into(), (deleted.len() as i64).into()];
    if since_0_4_0 {
        execute(RECORD, &record, |_| ());
    } else {
        execute(RECORD_BEFORE_0_4_0, &record[..2], |_| ());
    }
    // Nothing here needs to survive a crash: a sweep is lost whole, its deletions with the raised
    // high-water mark that covers them, and swept again.
    durability::skip_flush_if_alone(wal_before);
    changed
}

/// Sweeps up to `limit` rows of fast leases in shared memory (see `leases::state::memory`), skipping keys
/// another transaction is changing: (key, fence, deleted) of each row changed.
fn sweep_memory(now: i64, limit: i64, delete_before: Option<i64>) -> Vec<(String, i64, bool)> {
    let limit = usize::try_from(limit).unwrap_or(0);
    if limit == 0 {
        return Vec::new();
    }
    let (candidates, next) =
        memory::changes::sweep_candidates(RESUME_AT_BUCKET.get(), limit, now, delete_before);
    RESUME_AT_BUCKET.set(next);
    let mut swept = Vec::new();
    for candidate in &candidates {
        if !sweeps::try_lock_to_sweep(&candidate.key) {
            continue;
        }
        match memory::changes::sweep(candidate, now, delete_before) {
            Some((fence, deleted)) => swept.push((candidate.key.clone(), fence, deleted)),
            None => sweeps::unlock_swept(&candidate.key),
        }
    }
    swept
}

/// Sweeps up to `limit` rows of one lease table: (key, fence, deleted) of each row changed.
fn sweep_table(
    kind: Kind,
    now: i64,
    limit: i64,
    delete_before: Option<TimestampWithTimeZone>,
) -> Vec<(String, i64, bool)> {
    if limit <= 0 {
        return Vec::new();
    }
    let resume = RESUME_AT_PAGE.with(|pages| pages[kind as usize].get());
    let args = [clock::timestamp(now).into(), limit.into(), resume.into(), delete_before.into()];
    let statement = by_objects!(kind, sweep);
    let rows: Vec<Swept> = execute(statement, &args, |rows| {
        rows.map(|row| Swept {
            key: row.get(1).unwrap_or_report().unwrap_or_default(),
            fence: row.get(2).unwrap_or_report().unwrap_or_default(),
            page: row.get(3).unwrap_or_report().unwrap_or_default(),
            to_delete: row.get(4).unwrap_or_report().unwrap_or_default(),
            mode: LeaseMode {
                shared: row.get(6).unwrap_or_report().unwrap_or_default(),
                permits: row.get(7).unwrap_or_report().unwrap_or(1),
            },
            slot: row.get(5).unwrap_or_report().unwrap_or_default(),
            ctid: row.get(8).unwrap_or_report().unwrap_or_default(),
        })
        .collect()
    });
    // A full batch: go on from its last page next time. Fewer: the end of the table was reached;
    // start again from the beginning.
    let last_page = rows.iter().map(|row| row.page).max().unwrap_or(0);
    let next = if rows.len() as i64 == limit { last_page } else { 0 };
    RESUME_AT_PAGE.with(|pages| pages[kind as usize].set(next));

    let (to_delete, marked): (Vec<Swept>, Vec<Swept>) = rows.into_iter().partition(|row| row.to_delete);
    let deleted: Vec<Swept> =
        to_delete.into_iter().filter(|row| slots::writers_done(&row.key, row.mode, row.slot)).collect();
    if !deleted.is_empty() {
        let ctids: Vec<String> = deleted.iter().map(|row| row.ctid.clone()).collect();
        execute(by_objects!(kind, delete_rows), &[ctids.into()], |_| ());
    }
    let changed = |rows: Vec<Swept>, gone: bool| rows.into_iter().map(move |row| (row.key, row.fence, gone));
    changed(marked, false).chain(changed(deleted, true)).collect()
}

/// A row the sweep found in one lease table.
struct Swept {
    key: String,
    fence: i64,
    page: i64,
    to_delete: bool,
    mode: LeaseMode,
    slot: i32,
    ctid: String,
}
