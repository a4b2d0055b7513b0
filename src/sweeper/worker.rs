//! The sweeper background worker: with pg_fence in shared_preload_libraries, it connects to the
//! database named by pg_fence.database and calls fence.sweep() every pg_fence.sweep_interval (less
//! often on large tables, see `next_wait`). It does nothing while the extension is not created, or
//! while the server is a standby; SIGHUP reloads the settings; SIGTERM ends it. An error, or
//! pg_terminate_backend(), ends the worker (logged), and the postmaster starts it again after 5
//! seconds.
use crate::pg::settings;
use crate::sweeper;
use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, SignalWakeFlags};
use pgrx::prelude::*;
use std::time::{Duration, Instant};

const RESTART_AFTER: Duration = Duration::from_secs(5);

/// Each pass ends with a call that reads every row from where the last full batch stopped to the end
/// of the table, long on a large table even when it finds nothing or a handful (docs/benchmarks.md).
/// After a pass the worker waits at least this many times as long as that call took, so reading
/// through the table costs at most 1/50 of one CPU ...
const WAIT_PER_SCAN: u32 = 50;
/// ... but that stretch of the wait is capped, so a call held up by a lock does not put the sweeper
/// to sleep for long.
const SCAN_WAIT_AT_MOST: Duration = Duration::from_secs(60);

/// Called from _PG_init: registers the worker when loaded through shared_preload_libraries.
pub fn register() {
    // SAFETY: a backend-global flag set by the postmaster while it loads preloaded libraries.
    if !unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        return;
    }
    BackgroundWorkerBuilder::new("pg_fence sweeper")
        .set_type("pg_fence sweeper")
        .set_library("pg_fence")
        .set_function("pg_fence_sweeper_main")
        .enable_spi_access()
        .set_restart_time(Some(RESTART_AFTER))
        .load();
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn pg_fence_sweeper_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    BackgroundWorker::connect_worker_to_spi(Some(&settings::database()), None);
    log!("pg_fence sweeper started in database \"{}\"", settings::database());
    let mut wait = settings::sweep_interval();
    while BackgroundWorker::wait_latch(Some(wait)) {
        if BackgroundWorker::sighup_received() {
            // SAFETY: what every background worker does on SIGHUP, outside a transaction.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
        let interval = settings::sweep_interval();
        wait = interval;
        // SAFETY: a plain read of shared state.
        if unsafe { pg_sys::RecoveryInProgress() } {
            continue;
        }
        // One short transaction per batch, again at once while batches come back full.
        loop {
            let call = Instant::now();
            let swept = sweep_once();
            if swept < sweeper::BATCH || BackgroundWorker::sigterm_received() {
                wait = next_wait(interval, call.elapsed());
                break;
            }
        }
    }
    // SIGTERM. Exit code 1 asks the postmaster to start the worker again (after RESTART_AFTER), so
    // pg_terminate_backend() restarts it; at server shutdown the postmaster restarts nothing.
    // SAFETY: ends this process the way PostgreSQL's own workers do.
    unsafe { pg_sys::proc_exit(1) };
}

/// One call of fence.sweep() in a transaction of its own: how many leases it swept (0 while the
/// extension is not created).
fn sweep_once() -> i64 {
    BackgroundWorker::transaction(|| {
        let installed = "SELECT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'pg_fence')";
        if Spi::get_one::<bool>(installed).ok().flatten() != Some(true) {
            return 0;
        }
        Spi::get_one::<i64>("SELECT fence.sweep()").expect("fence.sweep()").unwrap_or(0)
    })
}

/// How long to wait before the next pass, given how long its last call (the one that read through
/// to the end of the table) took.
fn next_wait(interval: Duration, last_call: Duration) -> Duration {
    interval.max((last_call * WAIT_PER_SCAN).min(SCAN_WAIT_AT_MOST))
}

#[cfg(test)]
mod tests {
    use super::next_wait;
    use std::time::Duration;

    #[test]
    fn a_long_scan_stretches_the_wait_up_to_a_minute() {
        let (second, ms) = (Duration::from_secs(1), Duration::from_millis);
        assert_eq!(next_wait(second, ms(2)), second); // a small table
        assert_eq!(next_wait(second, ms(120)), Duration::from_secs(6)); // a million keys
        assert_eq!(next_wait(second, Duration::from_secs(3600)), Duration::from_secs(60)); // held up by a lock
        assert_eq!(next_wait(Duration::from_secs(300), ms(120)), Duration::from_secs(300));
        // a longer interval stands
    }
}
