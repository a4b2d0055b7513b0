//! Fenced writes: the cores of fence.fence_guard, fence.fenced_update and fence.fenced_write, whose
//! SQL shells (sql/fencing.sql) raise the stale-fence error PF002.
//!
//! The guard is what makes "a write accepted under fence F commits before any grant above F can
//! commit" true. It first takes the key's lock in `Guard` mode, which every grant waits for and which
//! it keeps until the writing transaction ends; only then does it read the latest committed grant.
use crate::keylock::{self, Mode};
use crate::row_update::RowUpdate;
use crate::spi_plans::execute;
use crate::{clock, input, lease_row};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::JsonB;

/// Core of fence.fence_guard: true when `fence` is the key's current fence and its lease is live;
/// then no higher grant can commit before this transaction ends. When false, it holds nothing.
///
/// The lease row is read in the latest committed state rather than in the transaction's snapshot,
/// which under REPEATABLE READ or SERIALIZABLE may predate the latest grant. Holding the key's lock,
/// nothing newer can commit meanwhile; and no row lock is taken, so the guard never holds up the
/// holder's renew or release. Not SECURITY DEFINER: see src/lease_row.rs.
#[pg_extern(volatile, parallel_unsafe)]
fn fence_holds(key: Option<&str>, fence: Option<i64>) -> bool {
    let key = input::key(key);
    let fence = input::required(fence, "fence");
    keylock::lock(key, Mode::Guard);
    let holds = lease_row::live_fence(key, clock::now()) == Some(fence);
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
    let args = update.arguments(changes, filter, None);
    execute(&sql, &args, |rows| rows.len() as i64)
}

/// Core of fence.fenced_write: when none of the rows matching `filter` holds a fence above `fence`,
/// sets `changes` and `fence_column = fence` on them and returns how many; NULL, writing nothing, when
/// one does. The matching rows are locked before they are checked, so no concurrent writer can slip
/// in between check and write.
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
    let fence = input::required(fence, "fence");
    let lock_and_check =
        update.select_sql(&format!("t.{column} OPERATOR(pg_catalog.>) $3"), "") + " FOR NO KEY UPDATE";
    let write = update.update_sql(&format!("{column} = $3"), "", "1");
    let args = update.arguments(changes, filter, Some(fence));
    let stale = execute(&lock_and_check, &args, |rows| {
        rows.into_iter().any(|row| row.get::<bool>(1).ok().flatten() == Some(true))
    });
    if stale {
        return None;
    }
    Some(execute(&write, &args, |rows| rows.len() as i64))
}
