//! Fenced writes: fence.fence_guard, fence.fenced_update and fence.fenced_write, C entry points
//! (declared in sql/fencing.sql) over the cores below, raising the stale-fence error PF002.
//!
//! The guard is what makes "a write accepted under fence F commits before any grant above F can
//! commit" true. It first takes the key's lock in `Guard` mode, which every grant waits for and which
//! it keeps until the writing transaction ends; only then does it read the latest committed grant.
use crate::leases::state::rows;
use crate::locks::keylock::{self, Owner};
use crate::pg::clock;
use crate::pg::errors;
use crate::pg::input;
use crate::pg::installed;
use crate::pg::own_errors::{entry_point, palloc_copy, Message, STALE_FENCE};
use crate::pg::spi_plans::execute;
use crate::stats::{self, Counter};
use crate::writes::json_object::JsonArg;
use crate::writes::row_update::RowUpdate;
use crate::writes::table_facts;
use pgrx::fcinfo::pg_getarg;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::Cell;
use std::ffi::CStr;

// The public functions (sql/fencing.sql): C entry points over the cores below, raising PF002 when
// the core answers "no" (src/pg/own_errors.rs).
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
/// holder's renew or release. The lock belongs to the top-level transaction (see `keylock`), so a
/// guard in a subtransaction that rolls back still holds back the next grant until the writes of
/// the rest of the transaction have committed. Not SECURITY DEFINER: see src/leases/row.rs.
#[pg_extern(volatile, parallel_unsafe)]
fn fence_holds(key: Option<&str>, fence: Option<i64>) -> bool {
    guard(input::key(key), input::required(fence, "fence"), Owner::TopTransaction)
}

/// The guard, its lock held for `owner`.
///
/// The guard is the one call whose safety rests on the key lock alone (changes of the lease row
/// are serialized by the row too). So it makes sure the lock it holds is still the key's: the
/// update from 0.3.0 changes the hash that names key locks, and a guard whose lock was named by
/// the old one while the update committed would hold back no grant made afterwards. Reading the
/// lease row has locked fence.lease_state, which the update holds exclusively until it commits,
/// and so brought in its catalog changes.
///
/// A fence that does not hold as last committed is refused before the lock is taken: a caller
/// without the live fence never holds up a grant, however often it calls.
fn guard(key: &str, fence: i64, owner: Owner) -> bool {
    // SAFETY: reads shared state.
    if unsafe { pg_sys::RecoveryInProgress() } {
        // A standby may not have replayed the revocation or grant that made this fence stale, and
        // its lock holds back no grant on the primary.
        errors::read_only("guard a write", true);
    }
    // The live holder with this fence, and the guard lock of its slot (see `leases::modes`).
    let holder = || {
        rows::live(key, clock::now())
            .find(|lease| lease.fence == fence)
            .map(|lease| lease.mode.guard_lock(lease.slot))
    };
    let Some(lock) = holder() else {
        stats::bump(Counter::GuardsRefused);
        return false;
    };
    let tag = keylock::lock_guard(key, lock, owner);
    let holds = holder() == Some(lock);
    if !same_lock(&keylock::guard_tag(key, lock), &tag) {
        keylock::unlock_guard(&tag, owner);
        errors::lock_hash_changed();
    }
    if !holds {
        keylock::unlock_guard(&tag, owner);
    }
    stats::bump(if holds { Counter::GuardsAccepted } else { Counter::GuardsRefused });
    holds
}

fn same_lock(a: &pg_sys::LOCKTAG, b: &pg_sys::LOCKTAG) -> bool {
    (a.locktag_field1, a.locktag_field2, a.locktag_field3, a.locktag_field4)
        == (b.locktag_field1, b.locktag_field2, b.locktag_field3, b.locktag_field4)
}

/// fence.fenced_update's core: the guard, then the write; None, writing nothing, when the guard
/// refuses the fence. Every argument is checked before the guard, so bad input holds no lock.
/// (No SQL function of its own: see `entry_point!`.)
///
/// Unlike fence_guard's, this guard's lock belongs to the current subtransaction: the write it
/// guards is made in that same subtransaction, so the two end together. A caller's savepoint
/// rolled back undoes both; an error in the write (a bad value, a missing privilege) lets the
/// lock go with the subtransaction that catches it.
#[pg_extern(sql = false)]
fn fenced_update_core(
    key: Option<&str>,
    fence: Option<i64>,
    target: Option<pg_sys::Oid>,
    changes: Option<JsonArg>,
    filter: Option<JsonArg>,
) -> Option<i64> {
    let (key, fence) = (input::key(key), input::required(fence, "fence"));
    let update = RowUpdate::new("fenced_update", target, changes.as_ref(), filter.as_ref());
    guard(key, fence, Owner::Subtransaction).then(|| run_update(&update, changes.as_ref(), filter.as_ref()))
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

/// The UPDATE that fenced_update makes once its guard has passed, as a SQL function of its own
/// (internal; the #[pg_test]s of the jsonb conversions call it): `UPDATE target SET changes WHERE
/// filter` with the caller's privileges; returns the number of rows updated.
#[pg_extern(volatile, parallel_unsafe)]
fn update_matching(target: Option<pg_sys::Oid>, changes: Option<JsonArg>, filter: Option<JsonArg>) -> i64 {
    let update = RowUpdate::new("fenced_update", target, changes.as_ref(), filter.as_ref());
    run_update(&update, changes.as_ref(), filter.as_ref())
}

fn run_update(update: &RowUpdate, changes: Option<&JsonArg>, filter: Option<&JsonArg>) -> i64 {
    let sql = update.update_sql("", "", "1");
    let args = update.arguments(changes, filter, None);
    execute(&sql, &args, |rows| rows.len() as i64)
}

/// Core of fence.fenced_write: when none of the rows matching `filter` holds a fence above `fence`,
/// sets `changes` and `fence_column = fence` on them and returns how many; None when one does,
/// which the entry point raises as PF002, rolling back whatever the call wrote.
///
/// Two statements. The first locks the matching rows and checks them: it waits for every writer
/// still changing one of them, and refuses at once if one holds a higher fence. The second, with a
/// snapshot taken after those writers ended, writes; it checks each row again as it comes to write
/// it (fence.fence_not_above, the last condition of its WHERE clause, which PostgreSQL evaluates
/// again on the newest version of a row that changed while it waited), so the rows checked are
/// exactly the rows written: a row that came to match the filter after the first statement
/// (inserted, or deleted and inserted again), or that a writer changed while the second waited
/// for it, is checked in the version that would be overwritten. It skips such a row and tells us;
/// we then answer None, so the error undoes the rows it did write.
///
/// No SQL function of its own any more: called directly, it could not undo what it wrote. The
/// symbol stays, for the SQL function of versions before 0.4.0 (CREATE EXTENSION ... VERSION).
#[pg_extern(sql = false)]
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
    // Over the objects of a version before 0.4.0 there is no fence_not_above: the write then checks
    // each row only in the first statement, as those versions did, until ALTER EXTENSION UPDATE.
    let recheck = if installed::since_0_4_0() {
        format!("fence.fence_not_above(t.{column}, $3)")
    } else {
        String::new()
    };
    let check_and_write = update.update_sql(&format!("{column} = $3"), &recheck, "1");
    let args = update.arguments(changes.as_ref(), filter.as_ref(), Some(fence));
    let stale = execute(&lock_and_check, &args, |rows| {
        rows.into_iter().any(|row| row.get::<bool>(1).ok().flatten() == Some(true))
    });
    if stale {
        stats::bump(Counter::GuardsRefused);
        return None;
    }
    let flag = OwnStaleRowFlag::take();
    let written = execute(&check_and_write, &args, |rows| rows.len() as i64);
    let accepted = !flag.raised();
    stats::bump(if accepted { Counter::GuardsAccepted } else { Counter::GuardsRefused });
    accepted.then_some(written)
}

/// This fenced_write's STALE_ROW_SKIPPED: a trigger of the table may run a fenced write of its own
/// in the middle of ours, so each saves the flag of the one it interrupts and gives it back when
/// it ends, also when it ends in an error (which pgrx turns into an unwinding panic).
struct OwnStaleRowFlag {
    outer: bool,
}

impl OwnStaleRowFlag {
    fn take() -> Self {
        OwnStaleRowFlag { outer: STALE_ROW_SKIPPED.replace(false) }
    }

    fn raised(&self) -> bool {
        STALE_ROW_SKIPPED.get()
    }
}

impl Drop for OwnStaleRowFlag {
    fn drop(&mut self) {
        STALE_ROW_SKIPPED.set(self.outer);
    }
}

thread_local! {
    /// Whether fence_not_above refused a row in the running fenced_write's UPDATE.
    static STALE_ROW_SKIPPED: Cell<bool> = const { Cell::new(false) };
}

/// fence.fence_not_above(row_fence, fence): whether a row holding `row_fence` may be written under
/// `fence` (NULL counts as below any fence). False also tells the fenced_write running it that it
/// met such a row. Declared in sql/fencing.sql with a high cost, so that PostgreSQL evaluates it
/// after the filter's conditions (and a row-level security policy's), on matching rows only.
#[pg_extern(sql = false)]
fn fence_not_above(row_fence: Option<i64>, fence: Option<i64>) -> bool {
    let fence = input::required(fence, "fence");
    let fits = row_fence.is_none_or(|row_fence| row_fence <= fence);
    if !fits {
        STALE_ROW_SKIPPED.set(true);
    }
    fits
}
