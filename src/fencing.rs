//! Fenced writes: fence.fence_guard, fence.fenced_update and fence.fenced_write, C entry points
//! (declared in sql/fencing.sql) over the cores below, raising the stale-fence error PF002.
//!
//! The guard is what makes "a write accepted under fence F commits before any grant above F can
//! commit" true. It first takes the key's lock in `Guard` mode, which every grant waits for and which
//! it keeps until the writing transaction ends; only then does it read the latest committed grant.
use crate::json_object::JsonArg;
use crate::keylock::{self, Mode};
use crate::own_errors::{entry_point, palloc_copy, Message, STALE_FENCE};
use crate::row_update::RowUpdate;
use crate::spi_plans::execute;
use crate::{clock, input, lease_row, table_facts};
use pgrx::fcinfo::pg_getarg;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::CStr;

// The public functions (sql/fencing.sql): C entry points over the cores below, raising PF002 when
// the core answers "no" (src/own_errors.rs).
entry_point!(
    pg_fence_fence_guard,
    pg_finfo_pg_fence_fence_guard,
    fence_holds_wrapper,
    |answer, _| answer.value() == 0,
    stale_fence
);
entry_point!(
    pg_fence_fenced_update,
    pg_finfo_pg_fence_fenced_update,
    fenced_update_core_wrapper,
    |_, is_null| is_null,
    stale_fence
);
entry_point!(
    pg_fence_fenced_write,
    pg_finfo_pg_fence_fenced_write,
    fenced_write_core_wrapper,
    |_, is_null| is_null,
    stale_write
);

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
    let holds = lease_row::live(key, clock::now()).is_some_and(|lease| lease.fence == fence);
    if !holds {
        keylock::unlock(key, Mode::Guard);
    }
    holds
}

/// fence.fenced_update's core: the guard, then the write; None, writing nothing, when the guard
/// refuses the fence. (No SQL function of its own: see `entry_point!`.)
#[pg_extern(sql = false)]
fn fenced_update_core(
    key: Option<&str>,
    fence: Option<i64>,
    target: Option<pg_sys::Oid>,
    changes: Option<JsonArg>,
    filter: Option<JsonArg>,
) -> Option<i64> {
    fence_holds(key, fence).then(|| update_matching(target, changes, filter))
}

/// fence.fenced_write's core, taking `fence_column` as the `name` it is in SQL.
#[pg_extern(sql = false)]
fn fenced_write_core(
    target: Option<pg_sys::Oid>,
    fence_column: Option<&CStr>,
    fence: Option<i64>,
    changes: Option<JsonArg>,
    filter: Option<JsonArg>,
) -> Option<i64> {
    let fence_column = fence_column.map(CStr::to_string_lossy);
    write_unless_stale(target, fence_column.as_deref(), fence, changes, filter)
}

/// PF002 of fence_guard and fenced_update, whose first arguments are the key and the fence.
fn stale_fence(fcinfo: pg_sys::FunctionCallInfo) -> Message {
    // SAFETY: arguments 0 and 1 of both functions are text and bigint.
    let (key, fence) = unsafe { (pg_getarg::<&str>(fcinfo, 0), pg_getarg::<i64>(fcinfo, 1)) };
    let fence = fence.map_or("<NULL>".into(), |f| f.to_string());
    Message {
        code: STALE_FENCE,
        text: palloc_copy(&format!("fence {fence} is stale for key \"{}\"", key.unwrap_or("<NULL>"))),
        detail: palloc_copy("The key's live lease has another fence, or no lease on it is live."),
        hint: c"Another holder took over, or the lease expired: stop writing, and acquire the key again.",
    }
}

/// PF002 of fenced_write(target regclass, fence_column name, fence bigint, changes, filter).
fn stale_write(fcinfo: pg_sys::FunctionCallInfo) -> Message {
    // SAFETY: the arguments have those types.
    let (target, column, fence, filter) = unsafe {
        (
            pg_getarg::<pg_sys::Oid>(fcinfo, 0).and_then(table_facts::qualified_name),
            pg_getarg::<&CStr>(fcinfo, 1).map(|c| table_facts::quote(&c.to_string_lossy())),
            pg_getarg::<i64>(fcinfo, 2).map(|f| f.to_string()),
            pg_getarg::<JsonArg>(fcinfo, 4).map(|filter| filter.text()),
        )
    };
    let [target, column, fence, filter] =
        [target, column, fence, filter].map(|v| v.unwrap_or("<NULL>".into()));
    Message {
        code: STALE_FENCE,
        text: palloc_copy(&format!("fence {fence} is stale for {filter} in {target}")),
        detail: palloc_copy(&format!("A row matching the filter already holds a higher {column}.")),
        hint: c"A writer with a newer fence got there first: stop, and do not retry with this fence.",
    }
}

/// Core of fence.fenced_update, called once its guard has passed: `UPDATE target SET changes WHERE
/// filter` with the caller's privileges; returns the number of rows updated.
#[pg_extern(volatile, parallel_unsafe)]
fn update_matching(target: Option<pg_sys::Oid>, changes: Option<JsonArg>, filter: Option<JsonArg>) -> i64 {
    let update = RowUpdate::new("fenced_update", target, changes.as_ref(), filter.as_ref());
    let sql = update.update_sql("", "", "1");
    let args = update.arguments(changes.as_ref(), filter.as_ref(), None);
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
    changes: Option<JsonArg>,
    filter: Option<JsonArg>,
) -> Option<i64> {
    let update = RowUpdate::new("fenced_write", target, changes.as_ref(), filter.as_ref());
    let column = update.counter_column("fence_column", fence_column);
    let fence = input::required(fence, "fence");
    let lock_and_check =
        update.select_sql(&format!("t.{column} OPERATOR(pg_catalog.>) $3"), "") + " FOR NO KEY UPDATE";
    let write = update.update_sql(&format!("{column} = $3"), "", "1");
    let args = update.arguments(changes.as_ref(), filter.as_ref(), Some(fence));
    let stale = execute(&lock_and_check, &args, |rows| {
        rows.into_iter().any(|row| row.get::<bool>(1).ok().flatten() == Some(true))
    });
    if stale {
        return None;
    }
    Some(execute(&write, &args, |rows| rows.len() as i64))
}
