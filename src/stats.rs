//! The counters of `fence.stats`: cumulative since the server started (or `fence.stats_reset()`),
//! for operators to watch grants, refusals, waits and lost leases.
//!
//! They live in shared memory, so they need pg_fence in shared_preload_libraries; without it the
//! view says `available = false` and shows NULLs, never zeros that would look like an idle server.
//! Counting is a relaxed atomic add: no WAL, no lock, nothing on the hot path but one cache line.
//! A call is counted when it returns, whatever its transaction does afterwards (a grant rolled
//! back still counts), as PostgreSQL's own cumulative statistics count what was attempted. A crash
//! of any backend reinitializes shared memory, and the counters start again (`since` says when).
use crate::pg::clock;
use crate::pg::settings;
use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgAtomic};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};

/// One counter each; the order is that of the array `fence.stats` reads (sql/stats.sql).
#[derive(Clone, Copy)]
pub enum Counter {
    GrantsDurable,
    GrantsFast,
    AcquiresRefused,
    Renewals,
    RenewalsLost,
    Releases,
    ReleasesStale,
    ExpiriesSwept,
    Revocations,
    SessionEnds,
    WaitsBegun,
    WaitsGranted,
    WaitsTimedOut,
    WaitMicrosTotal,
    WaitMicrosMax,
    GuardsAccepted,
    GuardsRefused,
}

const COUNTERS: usize = Counter::GuardsRefused as usize + 1;

pub struct Shared {
    counters: [AtomicU64; COUNTERS],
    since: AtomicI64,
}

// SAFETY: atomics only, with no pointers: valid in every process that maps the segment.
unsafe impl PGRXSharedMemory for Shared {}

static STATS: PgAtomic<Shared> = unsafe { PgAtomic::new(c"pg_fence stats") };

/// Set while the postmaster loads pg_fence, and so in every backend it forks.
static AVAILABLE: AtomicBool = AtomicBool::new(false);

/// Called from _PG_init: asks for the shared memory when preloading (it cannot be had later).
// pg_shmem_init! tests cfg features of PostgreSQL versions this crate does not declare.
#[allow(unexpected_cfgs)]
pub fn init() {
    // SAFETY: a backend-global flag set by the postmaster.
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        pg_shmem_init!(
            STATS = Shared {
                counters: [const { AtomicU64::new(0) }; COUNTERS],
                since: AtomicI64::new(clock::now()),
            }
        );
        AVAILABLE.store(true, Relaxed);
    }
}

/// The counters, when this server keeps them (pg_fence preloaded).
fn kept() -> Option<&'static Shared> {
    AVAILABLE.load(Relaxed).then(|| STATS.get())
}

/// The counters to count in: kept, and pg_fence.track_stats on.
fn shared() -> Option<&'static Shared> {
    kept().filter(|_| settings::stats())
}

/// Whether calls are being counted: for a count that costs work to make.
pub fn counting() -> bool {
    shared().is_some()
}

pub fn add(counter: Counter, n: u64) {
    if let Some(stats) = shared() {
        stats.counters[counter as usize].fetch_add(n, Relaxed);
    }
}

pub fn bump(counter: Counter) {
    add(counter, 1);
}

/// A wait that ended after `micros`, granted or not.
pub fn waited(micros: u64, granted: bool) {
    bump(if granted { Counter::WaitsGranted } else { Counter::WaitsTimedOut });
    add(Counter::WaitMicrosTotal, micros);
    if let Some(stats) = shared() {
        stats.counters[Counter::WaitMicrosMax as usize].fetch_max(micros, Relaxed);
    }
}

/// Core of the view fence.stats: whether the counters are kept, since when, and their values in
/// the order of `Counter`; NULLs when pg_fence is not preloaded.
#[pg_extern(volatile, parallel_safe)]
fn stats_values() -> TableIterator<
    'static,
    (name!(available, bool), name!(since, Option<TimestampWithTimeZone>), name!(counters, Option<Vec<i64>>)),
> {
    let row = match kept() {
        Some(stats) => {
            let values = stats.counters.iter().map(|c| c.load(Relaxed).min(i64::MAX as u64) as i64).collect();
            (true, Some(clock::timestamp(stats.since.load(Relaxed))), Some(values))
        }
        None => (false, None, None),
    };
    TableIterator::once(row)
}

/// fence.stats_reset(): every counter back to zero, `since` now. False when they are not kept.
#[pg_extern(volatile, parallel_unsafe)]
fn stats_reset() -> bool {
    let Some(stats) = kept() else {
        return false;
    };
    stats.counters.iter().for_each(|c| c.store(0, Relaxed));
    stats.since.store(clock::now(), Relaxed);
    true
}
