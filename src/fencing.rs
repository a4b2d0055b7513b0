//! Fenced writes: the cores of fence.fence_guard, fence.fenced_update and fence.fenced_write, whose
//! SQL shells (sql/fencing.sql) raise the stale-fence error PF002.
//!
//! The guard is what makes "a write accepted under fence F commits before any grant above F can
//! commit" true. It first takes the key's lock in `Guard` mode, which every grant waits for and which
//! it keeps until the writing transaction ends; only then does it read the latest committed grant.
use crate::keylock::{self, Mode};
use crate::row_update::RowUpdate;
use crate::spi_plans::execute;
use crate::{clock, input};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::JsonB;
use std::cell::Cell;

/// Is `$2` the key's current fence, with its lease live at `$3`?
const HOLDS: &str =
    concat!("SELECT fence = $2 AND ", live_at!("$3"), " FROM fence.lease_state WHERE key = $1\0");

thread_local! {
    /// HOLDS, prepared once per backend (kept by SPI_keepplan for the backend's life).
    static HOLDS_PLAN: Cell<pg_sys::SPIPlanPtr> = const { Cell::new(std::ptr::null_mut()) };
}

/// Core of fence.fence_guard: true when `fence` is the key's current fence and its lease is live;
/// then no higher grant can commit before this transaction ends. When false, it holds nothing.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn fence_holds(key: Option<&str>, fence: Option<i64>) -> bool {
    let key = input::key(key);
    let fence = input::required(fence, "fence");
    keylock::lock(key, Mode::Guard);
    let holds = holds_in_latest_state(key, fence, clock::now());
    if !holds {
        keylock::unlock(key, Mode::Guard);
    }
    holds
}

/// Reads the lease row in the latest committed state (GetLatestSnapshot) rather than in the
/// transaction's snapshot, which under REPEATABLE READ or SERIALIZABLE may predate the latest grant.
/// Holding the key's lock, nothing newer can commit meanwhile; and no row lock is taken, so the
/// guard never holds up the holder's renew or release.
fn holds_in_latest_state(key: &str, fence: i64, now: i64) -> bool {
    Spi::connect(|_| {
        // SAFETY: SPI is connected for the closure; the plan is kept for the backend's life; the
        // datums live in the SPI procedure context until the result is read below.
        unsafe {
            let mut plan = HOLDS_PLAN.get();
            if plan.is_null() {
                let mut types = [pg_sys::TEXTOID, pg_sys::INT8OID, pg_sys::TIMESTAMPTZOID];
                plan = pg_sys::SPI_prepare(HOLDS.as_ptr().cast(), 3, types.as_mut_ptr());
                pg_sys::SPI_keepplan(plan);
                HOLDS_PLAN.set(plan);
            }
            let mut values = [
                key.into_datum().unwrap(),
                fence.into_datum().unwrap(),
                clock::timestamp(now).into_datum().unwrap(),
            ];
            let nulls = [b' ' as std::ffi::c_char; 3];
            let latest = pg_sys::GetLatestSnapshot();
            let status = pg_sys::SPI_execute_snapshot(
                plan,
                values.as_mut_ptr(),
                nulls.as_ptr(),
                latest,
                std::ptr::null_mut(),
                true,
                false,
                1,
            );
            assert_eq!(status, pg_sys::SPI_OK_SELECT as i32, "fence_holds: SPI status {status}");
            if pg_sys::SPI_processed == 0 {
                return false;
            }
            let table = &*pg_sys::SPI_tuptable;
            let mut is_null = false;
            let answer = pg_sys::SPI_getbinval(*table.vals, table.tupdesc, 1, &mut is_null);
            !is_null && bool::from_datum(answer, false) == Some(true)
        }
    })
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
    let args = [changes.into(), filter.into(), fence.into()];
    let stale = execute(&lock_and_check, &args, |rows| {
        rows.into_iter().any(|row| row.get::<bool>(1).ok().flatten() == Some(true))
    });
    if stale {
        return None;
    }
    Some(execute(&write, &args, |rows| rows.len() as i64))
}
