//! The sweeper worker's launcher: with pg_fence in shared_preload_libraries, the postmaster starts
//! it once recovery has ended (never on a standby). It connects to no database, as PostgreSQL's
//! autovacuum launcher does, and starts the sweeper worker (`worker`) in pg_fence.database only
//! while that database exists and accepts connections. So a missing database, or one dropped
//! WITH (FORCE) under the worker, is waited for quietly (one LOG line), not retried by the
//! postmaster with a FATAL every few seconds; once it is created again, the worker starts in it.
//!
//! When the worker ends (an error, pg_terminate_backend(), DROP DATABASE ... WITH (FORCE)), the
//! launcher starts it again after RESTART_AFTER, if the database is still there. SIGHUP reloads
//! the settings; SIGTERM ends the launcher and its worker (pg_terminate_backend() of the launcher:
//! the postmaster starts it again after RESTART_AFTER, and it a new worker).
use crate::pg::settings;
use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, BackgroundWorkerStatus, SignalWakeFlags};
use pgrx::bgworkers::{BgWorkerStartTime, DynamicBackgroundWorker};
use pgrx::prelude::*;
use std::ffi::CStr;
use std::time::{Duration, Instant};

pub const RESTART_AFTER: Duration = Duration::from_secs(5);

/// How often the launcher looks whether a missing database has been created.
const LOOK_EVERY: Duration = Duration::from_secs(5);

/// Called from _PG_init: registers the launcher when loaded through shared_preload_libraries.
pub fn register() {
    // SAFETY: a backend-global flag set by the postmaster while it loads preloaded libraries.
    if !unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        return;
    }
    BackgroundWorkerBuilder::new("pg_fence launcher")
        .set_type("pg_fence launcher")
        .set_library("pg_fence")
        .set_function("pg_fence_launcher_main")
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(Some(RESTART_AFTER))
        .load();
}

/// Whether a worker could connect to the database now.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Database {
    Usable,
    Missing,
    /// datallowconn is false, or an interrupted DROP DATABASE left it invalid.
    Closed,
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn pg_fence_launcher_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    BackgroundWorker::connect_worker_to_spi(None, None);
    let name = settings::database();
    let mut sweeper: Option<DynamicBackgroundWorker> = None;
    // When the last worker ended (or could not be started): the next one waits RESTART_AFTER.
    let mut ended_at: Option<Instant> = None;
    let mut reported: Option<Database> = None;
    loop {
        if let Some(running) = &sweeper {
            match running.pid() {
                Err(BackgroundWorkerStatus::Stopped) => {
                    sweeper = None;
                    ended_at = Some(Instant::now());
                }
                Err(BackgroundWorkerStatus::PostmasterDied) => break,
                _ => {}
            }
        }
        let due = ended_at.map_or(Duration::ZERO, |ended| RESTART_AFTER.saturating_sub(ended.elapsed()));
        if sweeper.is_none() && due.is_zero() {
            let state = look_up(&name);
            if state == Database::Usable {
                reported = None;
                sweeper = start();
                if sweeper.is_none() {
                    ended_at = Some(Instant::now());
                }
            } else if reported != Some(state) {
                reported = Some(state);
                let why =
                    if state == Database::Missing { "does not exist" } else { "does not accept connections" };
                log!(
                    "pg_fence sweeper: database \"{name}\" (pg_fence.database) {why}; the sweeper worker \
                     starts once it does"
                );
            }
        }
        // The postmaster sets the latch when the worker ends (bgw_notify_pid).
        let wait = match &sweeper {
            Some(_) => None,
            None if due.is_zero() => Some(LOOK_EVERY),
            None => Some(due),
        };
        if !BackgroundWorker::wait_latch(wait) {
            break;
        }
        if BackgroundWorker::sighup_received() {
            // SAFETY: what every background worker does on SIGHUP, outside a transaction.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
    }
    if let Some(running) = sweeper {
        running.terminate();
    }
    // Exit code 1 asks the postmaster to start the launcher again (after RESTART_AFTER), so
    // pg_terminate_backend() restarts it; at server shutdown the postmaster restarts nothing.
    // SAFETY: ends this process the way PostgreSQL's own workers do.
    unsafe { pg_sys::proc_exit(1) };
}

/// The state of the database `name`, from pg_database: a shared catalog, readable without being
/// connected to a database, but only by a plain scan, as the autovacuum launcher reads it (its
/// indexes may not be in the relation cache of a process without a database).
fn look_up(name: &str) -> Database {
    BackgroundWorker::transaction(|| {
        let lock = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
        let mut state = Database::Missing;
        // SAFETY: a catalog scan inside a transaction, ended and closed before returning; the
        // tuples are pg_database's, read only while the scan is on them.
        unsafe {
            let catalog = pg_sys::table_open(pg_sys::DatabaseRelationId, lock);
            let scan = pg_sys::table_beginscan_catalog(catalog, 0, std::ptr::null_mut());
            loop {
                let tuple = pg_sys::heap_getnext(scan, pg_sys::ScanDirection::ForwardScanDirection);
                if tuple.is_null() {
                    break;
                }
                let form = &*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_database>(tuple);
                if CStr::from_ptr(form.datname.data.as_ptr()).to_bytes() == name.as_bytes() {
                    let usable = form.datallowconn && form.datconnlimit != pg_sys::DATCONNLIMIT_INVALID_DB;
                    state = if usable { Database::Usable } else { Database::Closed };
                    break;
                }
            }
            pg_sys::table_endscan(scan);
            pg_sys::table_close(catalog, lock);
        }
        state
    })
}

/// Starts the sweeper worker, telling it this launcher's pid; None when no background
/// worker slot is free (max_worker_processes), which is logged.
fn start() -> Option<DynamicBackgroundWorker> {
    // SAFETY: this process's pid, set at its start.
    let me = unsafe { pg_sys::MyProcPid };
    let started = BackgroundWorkerBuilder::new("pg_fence sweeper")
        .set_type("pg_fence sweeper")
        .set_library("pg_fence")
        .set_function("pg_fence_sweeper_main")
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(None)
        .set_argument(Some(pg_sys::Datum::from(me)))
        .set_notify_pid(me)
        .load_dynamic();
    if started.is_err() {
        warning!(
            "pg_fence sweeper: no background worker slot free for the sweeper worker; trying again in {} s \
             (raise max_worker_processes)",
            RESTART_AFTER.as_secs()
        );
    }
    started.ok()
}
