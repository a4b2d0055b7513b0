//! Fenced writes: the cores of fence.fence_guard, fence.fenced_update and fence.fenced_write, whose
//! SQL shells (sql/fencing.sql) raise the stale-fence error PF002.
//!
//! The guard is what makes "a write accepted under fence F commits before any grant above F can
//! commit" true: it takes the key's lock in `Guard` mode, which every grant waits for, and keeps it
//! until the writing transaction ends.
use crate::row_update::RowUpdate;
use crate::spi_plans::execute;
use crate::keylock::{self, Mode};
use crate::{clock, errors, input};
use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReportable;
use pgrx::prelude::*;
use pgrx::JsonB;

/// Is `$2` the key's current fence, with its lease live at `$3`?
const HOLDS: &str = "
    SELECT fence = $2 AND token_hash IS NOT NULL AND expires_at > $3 FROM fence.lease_state WHERE key = $1";

/// The same under REPEATABLE READ or SERIALIZABLE, whose snapshot may predate the latest grant: the
/// row lock makes PostgreSQL raise a serialization failure (40001) instead of reading a stale row.
const HOLDS_LOCKING: &str = "
    SELECT fence = $2 AND token_hash IS NOT NULL AND expires_at > $3 FROM fence.lease_state WHERE key = $1
       FOR SHARE";

/// Core of fence.fence_guard: true when `fence` is the key's current fence and its lease is live;
/// then no higher grant can commit before this transaction ends. When false, it holds nothing.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn fence_holds(key: Option<&str>, fence: Option<i64>) -> bool {
    let key = input::key(key);
    let fence = fence.unwrap_or_else(|| errors::null_argument("fence"));
    keylock::lock(key, Mode::Guard);
    // SAFETY: the transaction's isolation level, a backend-global.
    let snapshot_per_transaction = unsafe { pg_sys::XactIsoLevel } >= pg_sys::XACT_REPEATABLE_READ as i32;
    let sql = if snapshot_per_transaction { HOLDS_LOCKING } else { HOLDS };
    let args = [key.into(), fence.into(), clock::timestamp(clock::now()).into()];
    let holds =
        execute(sql, &args, |rows| !rows.is_empty() && rows.first().get::<bool>(1).unwrap_or_report() == Some(true));
    if !holds {
        keylock::unlock(key, Mode::Guard);
    }
    holds
}

/// Core of fence.fenced_update, called once its guard has passed: `UPDATE target SET changes WHERE
/// filter` with the caller's privileges; returns the number of rows updated.
#[pg_extern(volatile, parallel_unsafe)]
fn update_matching(target: Option<pg_sys::Oid>, changes: Option<JsonB>, filter: Option<JsonB>) -> i64 {
    let update = RowUpdate::new("fenced_update", target, changes.as_ref(), filter.as_ref());
    let sql = update.update_sql("", "", "1");
    let args = [changes.into(), filter.into(), None::<i64>.into()];
    execute(&sql, &args, |rows| rows.len() as i64)
}

/// Core of fence.fenced_write: sets `changes` and `fence_column = fence` on the rows matching
/// `filter` whose fence_column is NULL or at most `fence`. Returns the number of rows updated, or
/// NULL when a matching row holds a higher fence: the shell then raises PF002, which undoes the
/// update. Row locks taken by the UPDATE keep a concurrent writer from slipping in between.
#[pg_extern(volatile, parallel_unsafe)]
fn write_unless_stale(
    target: Option<pg_sys::Oid>,
    fence_column: Option<&str>,
    fence: Option<i64>,
    changes: Option<JsonB>,
    filter: Option<JsonB>,
) -> Option<i64> {
    let update = RowUpdate::new("fenced_write", target, changes.as_ref(), filter.as_ref());
    let column = update.counter_column("fence_column", fence_column);
    let fence = fence.unwrap_or_else(|| errors::null_argument("fence"));
    let write = update.update_sql(
        &format!("{column} = $3"),
        &format!("(t.{column} IS NULL OR t.{column} <= $3)"),
        "1",
    );
    let newer = update.select_sql("1", &format!("t.{column} > $3")) + " LIMIT 1";
    let args = [changes.into(), filter.into(), fence.into()];
    let written = execute(&write, &args, |rows| rows.len() as i64);
    let stale = execute(&newer, &args, |rows| !rows.is_empty());
    (!stale).then_some(written)
}
