//! The sweeper background worker, started by its launcher (`launcher`) in the database named by
//! pg_fence.database: it calls fence.sweep() every pg_fence.sweep_interval (less often on large
//! tables, see `next_wait`) and, with pg_fence.guard_timeout set, ends the guards that hold back a
//! grant for longer than that (`overrun`), looking every sweep_interval. It sweeps nothing while the
//! extension is not created; SIGHUP reloads the settings and sweeps at once; SIGTERM ends it. It
//! ends with its launcher, and an error, pg_terminate_backend() or DROP DATABASE ... WITH (FORCE)
//! ends it (logged): the launcher starts it again.
use crate::pg::settings;
use crate::sweeper;
use crate::sweeper::overrun::Overruns;
use pgrx::bgworkers::{BackgroundWorker, SignalWakeFlags};
use pgrx::prelude::*;
use std::time::{Duration, Instant};

/// Each pass ends with a call that reads every row from where the last full batch stopped to the end
/// of the table, long on a large table even when it finds nothing or a handful (docs/benchmarks.md).
/// After a pass the worker waits at least this many times as long as that call took, so reading
/// through the table costs at most 1/50 of one CPU ...
const WAIT_PER_SCAN: u32 = 50;
/// ... but that stretch of the wait is capped, so a call held up by a lock does not put the sweeper
/// to sleep for long.
const SCAN_WAIT_AT_MOST: Duration = Duration::from_secs(60);

/// `arg`: the launcher's pid.
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn pg_fence_sweeper_main(arg: pg_sys::Datum) {
    let launcher = arg.value() as i32;
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    BackgroundWorker::connect_worker_to_spi(Some(&settings::database()), None);
    log!("pg_fence sweeper started in database \"{}\"", settings::database());
    let mut overruns = Overruns::default();
    let mut next_sweep = Instant::now() + settings::sweep_interval();
    loop {
        let interval = settings::sweep_interval();
        let until_sweep = next_sweep.saturating_duration_since(Instant::now());
        let wait = if settings::guard_timeout().is_some() { until_sweep.min(interval) } else { until_sweep };
        if !BackgroundWorker::wait_latch(Some(wait)) {
            break;
        }
        if BackgroundWorker::sighup_received() {
            // SAFETY: what every background worker does on SIGHUP, outside a transaction.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
            next_sweep = Instant::now();
        }
        // A launcher that ended (pg_terminate_backend) is started again, and starts a worker of its
        // own: this one gives way.
        // SAFETY: looks the pid up in the proc array, under its lock.
        if unsafe { pg_sys::BackendPidGetProc(launcher) }.is_null() {
            break;
        }
        // SAFETY: a plain read of shared state.
        if unsafe { pg_sys::RecoveryInProgress() } {
            continue;
        }
        if let Some(timeout) = settings::guard_timeout() {
            overruns.check(timeout);
        }
        if Instant::now() < next_sweep {
            continue;
        }
        // One short transaction per batch, again at once while batches come back full.
        loop {
            let call = Instant::now();
            let swept = sweep_once();
            if swept < sweeper::BATCH || BackgroundWorker::sigterm_received() {
                next_sweep = Instant::now() + next_wait(settings::sweep_interval(), call.elapsed());
                break;
            }
        }
    }
    // SIGTERM, or the launcher ended. The launcher, not the postmaster, starts the worker again.
    // SAFETY: ends this process the way PostgreSQL's own workers do.
    unsafe { pg_sys::proc_exit(0) };
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
