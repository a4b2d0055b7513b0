//! A transaction's changes to fast leases, kept in the backend until it commits: other sessions
//! read the last committed rows in shared memory, this one reads those with its own changes laid
//! over them (as it would read its own changes to a table). The commit applies them, before it lets
//! go of its locks; a rollback drops them, and a rollback to a savepoint drops those made since.
//! Nobody else can change the key meanwhile: every change holds the key's lock until the
//! transaction ends (see `keylock`). A transaction that changed a fast lease cannot be prepared: a
//! prepared transaction outlives its backend, and would outlive a crash that the lease does not.
use super::row::Row;
use super::shared::{self, Place};
use crate::pg::errors;
use pgrx::pg_sys;
use pgrx::{register_xact_callback, PgXactCallbackEvent};
use std::cell::{Cell, RefCell};

struct Write {
    place: Place,
    key: String,
    slot: i32,
    /// None: the row is deleted.
    row: Option<Row>,
    /// The subtransaction that made it: a rollback to a savepoint drops the changes of every
    /// subtransaction since (their ids are larger).
    subtransaction: pg_sys::SubTransactionId,
    /// Whether it holds a row reserved in the shared table (a row the table does not have yet).
    reserved: bool,
}

thread_local! {
    static WRITES: RefCell<Vec<Write>> = const { RefCell::new(Vec::new()) };
    static SUBTRANSACTION_CALLBACK: Cell<bool> = const { Cell::new(false) };
}

/// `key`'s rows as this transaction sees them: the committed ones with its own changes over them.
pub fn rows(key: &str) -> Vec<Row> {
    let Some(place) = Place::of(key) else { return Vec::new() };
    let mut rows = shared::rows(place, key);
    WRITES.with_borrow(|writes| {
        for write in writes.iter().filter(|write| write.place == place && write.key == key) {
            rows.retain(|row| row.slot != write.slot);
            rows.extend(write.row);
        }
    });
    rows.sort_by_key(|row| row.slot);
    rows
}

/// Sets `key`'s row of `row.slot` at this transaction's commit.
pub fn put(key: &str, row: Row) {
    if crate::pg::settings::trace_fast_changes() {
        let before = rows(key).into_iter().find(|each| each.slot == row.slot);
        super::trace::change(key, before.as_ref(), &row);
    }
    change(key, row.slot, Some(row));
}

/// Deletes `key`'s row of `slot` at this transaction's commit.
pub fn delete(key: &str, slot: i32) {
    change(key, slot, None);
}

fn change(key: &str, slot: i32, row: Option<Row>) {
    let Some(place) = Place::of(key) else {
        errors::state_damaged("fast leases in shared memory are used without pg_fence preloaded");
    };
    let reserved = WRITES.with_borrow(|writes| {
        writes
            .iter()
            .any(|write| write.place == place && write.key == key && write.slot == slot && write.reserved)
    });
    // A row the table does not have yet is reserved now, so that the commit cannot run out of them.
    let reserve = row.is_some() && !reserved && !shared::has_row(place, key, slot);
    if reserve && !shared::reserve() {
        errors::fast_leases_full(shared::usage().map_or(0, |(_, capacity, _)| capacity));
    }
    if WRITES.with_borrow(|writes| writes.is_empty()) {
        register_callbacks();
    }
    // SAFETY: the current subtransaction's id, as PostgreSQL's own modules read it.
    let subtransaction = unsafe { pg_sys::GetCurrentSubTransactionId() };
    let write = Write { place, key: key.to_owned(), slot, row, subtransaction, reserved: reserve };
    WRITES.with_borrow_mut(|writes| writes.push(write));
}

/// Whether this transaction has changed a fast lease.
pub fn changed_any() -> bool {
    WRITES.with_borrow(|writes| !writes.is_empty())
}

fn register_callbacks() {
    register_xact_callback(PgXactCallbackEvent::Commit, apply);
    register_xact_callback(PgXactCallbackEvent::Abort, drop_all);
    register_xact_callback(PgXactCallbackEvent::PrePrepare, || {
        if changed_any() {
            drop_all();
            errors::prepare_after_fast_change();
        }
    });
    if !SUBTRANSACTION_CALLBACK.replace(true) {
        // SAFETY: a callback for the life of the backend; it only drops this backend's own changes.
        unsafe { pg_sys::RegisterSubXactCallback(Some(on_subtransaction), std::ptr::null_mut()) };
    }
}

/// The commit: each changed row set to the last change made to it. Never fails (the rows it adds
/// were reserved), so nothing can be half applied.
fn apply() {
    let writes = WRITES.take();
    for (i, write) in writes.iter().enumerate() {
        let same_row =
            |later: &Write| later.place == write.place && later.key == write.key && later.slot == write.slot;
        let last = !writes[i + 1..].iter().any(same_row);
        let reserved_here = writes.iter().any(|each| same_row(each) && each.reserved);
        if last {
            shared::apply(write.place, &write.key, write.slot, write.row.as_ref(), reserved_here);
        }
    }
}

fn drop_all() {
    for write in WRITES.take() {
        if write.reserved {
            shared::unreserve();
        }
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn on_subtransaction(
    event: pg_sys::SubXactEvent::Type,
    subtransaction: pg_sys::SubTransactionId,
    _parent: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    if event != pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB {
        return;
    }
    WRITES.with_borrow_mut(|writes| {
        writes.retain(|write| {
            let keep = write.subtransaction < subtransaction;
            if !keep && write.reserved {
                shared::unreserve();
            }
            keep
        })
    });
}
