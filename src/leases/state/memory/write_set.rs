//! A transaction's changes to fast leases, kept in the backend until it commits: other sessions
//! read the last committed rows in shared memory, this one reads those with its own changes laid
//! over them (as it would read its own changes to a table). The commit applies them, before it lets
//! go of its locks; a rollback drops them, and a rollback to a savepoint drops those made since.
//! Nobody else can change the key meanwhile: every change holds the key's lock until the
//! transaction ends (see `keylock`). A transaction that changed a fast lease cannot be prepared: a
//! prepared transaction outlives its backend, and would outlive a crash that the lease does not.
use super::charges::{self, NoRoom};
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
    /// The role whose reservation of a row in the shared table it holds (for a row the table does
    /// not have yet), if it does.
    reserved: Option<u32>,
    /// The role a row the table has is charged to at commit, instead of the one that made it (the
    /// charge taken already), when another role's lease takes it.
    recharged: Option<u32>,
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

/// Sets `key`'s row of `row.slot` at this transaction's commit; a row the table does not have yet
/// is reserved now, charged to the session's role, so that the commit cannot run out of them, and
/// one charged to another role is charged to this one when a lease of its takes it (`calls::holder`),
/// each within the role's limit.
pub fn put(key: &str, row: Row, holder: bool) -> Result<(), NoRoom> {
    let place = place_of(key);
    let (charged, recharged) = WRITES.with_borrow(|writes| {
        let of_row = || {
            writes.iter().filter(|write| write.place == place && write.key == key && write.slot == row.slot)
        };
        (of_row().any(|write| write.reserved.is_some()), of_row().any(|write| write.recharged.is_some()))
    });
    let charged_to = charges::charged_role(place, key, row.slot);
    let role = (!charged && charged_to.is_none()).then(session_role);
    if let Some(role) = role {
        charges::reserve(role)?;
    }
    // A row another role made is charged to the role whose lease takes it, within that role's limit.
    let recharge = (holder && !recharged && !charged)
        .then(session_role)
        .filter(|me| charged_to.is_some_and(|to| to != *me));
    if let Some(me) = recharge {
        charges::charge(me)?;
    }
    if crate::pg::settings::trace_fast_changes() {
        let before = rows(key).into_iter().find(|each| each.slot == row.slot);
        super::trace::change(key, before.as_ref(), &row);
    }
    push(Write {
        place,
        key: key.to_owned(),
        slot: row.slot,
        row: Some(row),
        subtransaction: 0,
        reserved: role,
        recharged: recharge,
    });
    Ok(())
}

/// Deletes `key`'s row of `slot` at this transaction's commit.
pub fn delete(key: &str, slot: i32) {
    push(Write {
        place: place_of(key),
        key: key.to_owned(),
        slot,
        row: None,
        subtransaction: 0,
        reserved: None,
        recharged: None,
    });
}

fn place_of(key: &str) -> Place {
    Place::of(key).unwrap_or_else(|| {
        errors::state_damaged("fast leases in shared memory are used without pg_fence preloaded")
    })
}

/// The role the session acts as (SET ROLE included), outside pg_fence's SECURITY DEFINER functions.
pub fn session_role() -> u32 {
    // SAFETY: reads the backend's user state.
    unsafe { pg_sys::GetOuterUserId() }.to_u32()
}

fn push(mut write: Write) {
    if WRITES.with_borrow(|writes| writes.is_empty()) {
        register_callbacks();
    }
    // SAFETY: the current subtransaction's id, as PostgreSQL's own modules read it.
    write.subtransaction = unsafe { pg_sys::GetCurrentSubTransactionId() };
    WRITES.with_borrow_mut(|writes| writes.push(write));
}

/// Whether this transaction has changed `key`'s rows.
pub fn changes_key(key: &str) -> bool {
    WRITES.with_borrow(|writes| writes.iter().any(|write| write.key == key))
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
        let reserved_here = writes.iter().filter(|each| same_row(each)).find_map(|each| each.reserved);
        if last {
            shared::apply(write.place, &write.key, write.slot, write.row.as_ref(), reserved_here);
        }
        if let Some(role) = write.recharged {
            if writes.iter().rfind(|each| same_row(each)).is_some_and(|last| last.row.is_some()) {
                charges::recharge(write.place, &write.key, write.slot, role);
            } else {
                charges::uncharge_role(role);
            }
        }
    }
}

fn drop_all() {
    WRITES.take().iter().for_each(give_back);
}

/// Gives back what a change that is dropped reserved or charged.
fn give_back(write: &Write) {
    if let Some(role) = write.reserved {
        charges::unreserve(role);
    }
    if let Some(role) = write.recharged {
        charges::uncharge_role(role);
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
            if !keep {
                give_back(write);
            }
            keep
        })
    });
}
