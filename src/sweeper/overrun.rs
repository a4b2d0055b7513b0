//! pg_fence.guard_timeout: the bound on how long a guard may hold back a grant, enforced by the
//! sweeper worker.
//!
//! A grant of a key waits for every transaction that holds the key's lock in Guard mode (see
//! `locks::keylock`), until that transaction ends. A client that keeps such a transaction open,
//! running short statements, is never ended by statement_timeout or
//! idle_in_transaction_session_timeout. So each pass, the worker looks in pg_locks (all databases)
//! for the holders of a guard lock in Guard mode (RowShareLock: the key lock, class 28774, or a
//! holder's guard lock, class 28777) while a grant (ExclusiveLock) waits for it, and terminates
//! the backend of each one that has held a grant
//! back for longer than the setting. Terminated, not cancelled: a cancel does not end a transaction
//! that is idle between statements. The holder's transaction rolls back, so its writes under the
//! old fence never commit after the new grant (invariant 3 stands).
//!
//! A grant waits on the key lock only once the lease has ended (while it is live, waiters sleep in
//! the waiting room, see `leases::waiting`), so a guard that holds a grant back has outlived the
//! lease it guarded. An acquire that gives up and tries again leaves pg_locks for a moment: the
//! worker remembers, for each guard it saw holding a grant back, since when (the earliest
//! `waitstart` it saw), for as long as that guard stays held.
//!
//! A prepared transaction (PREPARE TRANSACTION, for a two-phase commit) has no backend to end. The
//! worker does not roll it back: its transaction manager may already have committed the other
//! branches of that transaction, and rolling back this one would break the atomicity it promised.
//! It reports it, once, with a WARNING that names its gid; the operator (or the transaction
//! manager) decides with COMMIT PREPARED or ROLLBACK PREPARED (docs/operations.md).
use pgrx::bgworkers::BackgroundWorker;
use pgrx::pg_sys::panic::{ErrorReport, ErrorReportable};
use pgrx::prelude::*;
use pgrx::{PgLogLevel, PgSqlErrorCode};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// Every guard held while a grant of its key waits (`since`: the earliest wait, NULL when none
/// waits now), and the guards remembered from earlier passes ($1): their ids, holders (pid NULL
/// for a prepared transaction, then its gid, found through the transaction id lock it holds with
/// the same virtual transaction) and database; and the clock now. Advisory locks are never taken on
/// the fast path, so pg_locks lists them all.
const HELD_BACK: &str = "
    WITH locks AS MATERIALIZED (
        SELECT locktype, virtualtransaction, transactionid, pid, database, classid, objid, objsubid, mode, granted,
               waitstart
          FROM pg_catalog.pg_locks
         WHERE (locktype = 'advisory' AND objsubid IN (28774, 28777)) OR (locktype = 'transactionid' AND pid IS NULL)),
    waiting AS (
        SELECT database, classid, objid, objsubid, min(waitstart) AS since
          FROM locks
         WHERE locktype = 'advisory' AND NOT granted AND mode = 'ExclusiveLock'
         GROUP BY database, classid, objid, objsubid),
    guards AS (
        SELECT g.virtualtransaction || ' ' || g.database || ' ' || g.classid || ' ' || g.objid || ' ' || g.objsubid AS id,
               g.virtualtransaction, g.pid, g.database, w.since
          FROM locks g LEFT JOIN waiting w USING (database, classid, objid, objsubid)
         WHERE g.locktype = 'advisory' AND g.granted AND g.mode = 'RowShareLock')
    SELECT id, pid,
           (SELECT datname::pg_catalog.text FROM pg_catalog.pg_database d WHERE d.oid = guards.database),
           (SELECT p.gid FROM locks x JOIN pg_catalog.pg_prepared_xacts p ON p.transaction = x.transactionid
             WHERE guards.pid IS NULL AND x.locktype = 'transactionid'
               AND x.virtualtransaction = guards.virtualtransaction),
           (extract(epoch FROM since) * 1000000)::pg_catalog.int8,
           (extract(epoch FROM pg_catalog.clock_timestamp()) * 1000000)::pg_catalog.int8
      FROM guards
     WHERE since IS NOT NULL OR id = ANY ($1)";

/// One guard lock held, as HELD_BACK reads it.
struct Guard {
    /// Its holder's virtual transaction and the lock: one guard, for as long as it is held.
    id: String,
    pid: Option<i32>,
    database: Option<String>,
    gid: Option<String>,
    /// Since when (µs since 1970) a grant waits for it, if one waits now.
    waited_since: Option<i64>,
    now: i64,
}

/// What the worker keeps between passes.
#[derive(Default)]
pub struct Overruns {
    /// Since when each guard seen holding back a grant has done so, while it stays held.
    held_back_since: HashMap<String, i64>,
    /// The guards already acted on (terminated, or reported when prepared): once each.
    acted_on: HashSet<String>,
}

impl Overruns {
    /// One look at pg_locks, and the backends to terminate terminated.
    pub fn check(&mut self, timeout: Duration) {
        let timeout_us = i64::try_from(timeout.as_micros()).unwrap_or(i64::MAX);
        let remembered: Vec<String> = self.held_back_since.keys().cloned().collect();
        let guards = BackgroundWorker::transaction(|| read(remembered));
        let mut since_now = HashMap::new();
        let mut to_terminate = Vec::new();
        for guard in guards {
            let earliest =
                self.held_back_since.get(&guard.id).copied().into_iter().chain(guard.waited_since).min();
            let Some(since) = earliest else { continue };
            since_now.insert(guard.id.clone(), since);
            let held_back_ms = (guard.now - since) / 1000;
            if guard.now - since < timeout_us || self.acted_on.contains(&guard.id) {
                continue;
            }
            let database = guard.database.unwrap_or_default();
            match (guard.pid, guard.gid) {
                (Some(pid), _) => {
                    report_termination(pid, &database, held_back_ms, timeout);
                    to_terminate.push(pid);
                }
                (None, Some(gid)) => report_prepared(&gid, &database, held_back_ms, timeout),
                // A prepared transaction that ended while pg_prepared_xacts was read: looked at
                // again next time, if its guard is still listed.
                (None, None) => continue,
            }
            self.acted_on.insert(guard.id);
        }
        self.held_back_since = since_now;
        self.acted_on.retain(|id| self.held_back_since.contains_key(id));
        to_terminate.sort_unstable();
        to_terminate.dedup();
        if !to_terminate.is_empty() {
            BackgroundWorker::transaction(|| {
                for pid in to_terminate {
                    // false when the backend has exited meanwhile: nothing left to end.
                    Spi::get_one_with_args::<bool>(
                        "SELECT pg_catalog.pg_terminate_backend($1)",
                        &[pid.into()],
                    )
                    .unwrap_or_report();
                }
            });
        }
    }
}

fn read(remembered: Vec<String>) -> Vec<Guard> {
    Spi::connect(|client| {
        let rows = client.select(HELD_BACK, None, &[remembered.into()]).unwrap_or_report();
        rows.map(|row| Guard {
            id: row.get(1).unwrap_or_report().unwrap_or_default(),
            pid: row.get(2).unwrap_or_report(),
            database: row.get(3).unwrap_or_report(),
            gid: row.get(4).unwrap_or_report(),
            waited_since: row.get(5).unwrap_or_report(),
            now: row.get(6).unwrap_or_report().unwrap_or_default(),
        })
        .collect()
    })
}

fn report_termination(pid: i32, database: &str, held_back_ms: i64, timeout: Duration) {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_ADMIN_SHUTDOWN,
        format!(
            "pg_fence: terminating backend {pid}: its transaction holds a guard of a key in database \
             \"{database}\" that has held back a waiting grant for {held_back_ms} ms, longer than \
             pg_fence.guard_timeout ({} ms)",
            timeout.as_millis()
        ),
        "pg_fence",
    )
    .set_detail("The guard's lease has ended; its transaction rolls back, and the grant goes ahead.")
    .set_hint("End transactions that write under a guard promptly after their writes.")
    .report(PgLogLevel::LOG);
}

fn report_prepared(gid: &str, database: &str, held_back_ms: i64, timeout: Duration) {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!(
            "pg_fence: prepared transaction \"{gid}\" holds a guard of a key in database \"{database}\" \
             that has held back a waiting grant for {held_back_ms} ms, longer than pg_fence.guard_timeout \
             ({} ms)",
            timeout.as_millis()
        ),
        "pg_fence",
    )
    .set_detail(
        "The sweeper worker does not end prepared transactions: the grant waits until this one is \
         committed or rolled back.",
    )
    .set_hint(format!(
        "Have its transaction manager resolve it, or run COMMIT PREPARED '{gid}' or ROLLBACK PREPARED \
         '{gid}' in database \"{database}\"."
    ))
    .report(PgLogLevel::WARNING);
}
