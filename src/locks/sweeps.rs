//! Sweeps of fast leases' rows in shared memory, and the grants that wait them out. A sweep (the
//! worker's, fence.sweep(), or a grant's freeing of rows to make room) changes a row under its
//! key's lock, as a lease call does; a grant that does not wait counts a key another transaction is
//! changing as held, but a sweep only ends or deletes the row of an ended lease, so the key is free:
//! the grant waits for the sweep instead, as it waits for a sweep's row lock on a lease in a table.
//!
//! A sweep shows itself by a mark beside the key's lock (class `SWEEP_CLASS`, one per bucket of
//! keys, so that a sweep of a thousand keys takes a few hundred more locks at most). The mark is a
//! session lock given back after the transaction's own locks (`give_back_marks`): a grant woken by
//! the mark's release finds the key's lock released already.
use super::key_hash;
use super::keylock::{self, Mode, Owner};
use pgrx::pg_sys;
use std::cell::{Cell, RefCell};

/// Taken by sweeps in a mode they share; waited for by grants in one that conflicts with it and not
/// with itself, so that neither sweeps nor grants queue behind their own kind.
const SWEEPING: pg_sys::LOCKMODE = pg_sys::RowExclusiveLock as pg_sys::LOCKMODE;
const WAITED: pg_sys::LOCKMODE = pg_sys::ShareLock as pg_sys::LOCKMODE;
const BUCKETS: u64 = 256;
/// How many sweeps in a row a grant waits out before it counts the key as held.
const WAITED_OUT: usize = 3;

thread_local! {
    /// The marks this backend's transaction holds, one entry per acquisition.
    static MARKS: RefCell<Vec<pg_sys::LOCKTAG>> = const { RefCell::new(Vec::new()) };
    static CALLBACK_REGISTERED: Cell<bool> = const { Cell::new(false) };
}

/// `keylock::try_lock` for a grant that does not wait for the key, but waits out sweeps of it.
/// A sweep's transaction is short: fence.sweep() runs only in a transaction of its own, and a
/// grant's freeing of rows gives its locks back at once.
pub fn try_lock_for_grant(key: &str, mode: Mode) -> bool {
    let mark = mark_of(key);
    for _ in 0..WAITED_OUT {
        if keylock::try_lock(key, mode) {
            return true;
        }
        if keylock::acquire(&mark, WAITED, Owner::Subtransaction, true) {
            // No sweep is changing keys of this bucket: another transaction holds the key.
            keylock::release(&mark, WAITED, Owner::Subtransaction);
            return false;
        }
        keylock::acquire(&mark, WAITED, Owner::Subtransaction, false);
        keylock::release(&mark, WAITED, Owner::Subtransaction);
    }
    keylock::try_lock(key, mode)
}

/// Takes the key's lock for a sweep (in `Change` mode), with its mark, if nobody holds it; false,
/// nothing taken, otherwise. Never waits.
pub fn try_lock_to_sweep(key: &str) -> bool {
    register_callback();
    let mark = mark_of(key);
    // SAFETY: a session lock, given back by `unlock_swept` or `give_back_marks`.
    let marked = unsafe { pg_sys::LockAcquire(&mark, SWEEPING, true, true) };
    if marked == pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL {
        return false;
    }
    MARKS.with_borrow_mut(|marks| marks.push(mark));
    if keylock::try_lock(key, Mode::Change) {
        return true;
    }
    unmark(&mark);
    false
}

/// Gives back `try_lock_to_sweep`'s locks before the transaction ends, the key's first.
pub fn unlock_swept(key: &str) {
    keylock::unlock(key, Mode::Change);
    unmark(&mark_of(key));
}

fn mark_of(key: &str) -> pg_sys::LOCKTAG {
    keylock::tag(keylock::SWEEP_CLASS, key_hash::of(key) % BUCKETS)
}

fn unmark(mark: &pg_sys::LOCKTAG) {
    MARKS.with_borrow_mut(|marks| {
        if let Some(at) = marks.iter().position(|each| same(each, mark)) {
            marks.swap_remove(at);
        }
    });
    // SAFETY: gives back one acquisition of a session lock this backend took.
    unsafe { pg_sys::LockRelease(mark, SWEEPING, true) };
}

fn same(a: &pg_sys::LOCKTAG, b: &pg_sys::LOCKTAG) -> bool {
    (a.locktag_field1, a.locktag_field2, a.locktag_field3, a.locktag_field4)
        == (b.locktag_field1, b.locktag_field2, b.locktag_field3, b.locktag_field4)
}

fn register_callback() {
    if CALLBACK_REGISTERED.replace(true) {
        return;
    }
    // SAFETY: a callback for the life of the backend, as PostgreSQL's own modules register them.
    unsafe { pg_sys::RegisterResourceReleaseCallback(Some(give_back_marks), std::ptr::null_mut()) };
}

/// At the end of a transaction, committed or not, once its own locks (the keys' among them) are
/// given back: gives back the marks it still holds.
unsafe extern "C-unwind" fn give_back_marks(
    phase: pg_sys::ResourceReleasePhase::Type,
    _is_commit: bool,
    is_top_level: bool,
    _arg: *mut std::ffi::c_void,
) {
    if phase != pg_sys::ResourceReleasePhase::RESOURCE_RELEASE_AFTER_LOCKS || !is_top_level {
        return;
    }
    for mark in MARKS.with_borrow_mut(std::mem::take) {
        // SAFETY: each a session lock this backend took and has not given back.
        unsafe { pg_sys::LockRelease(&mark, SWEEPING, true) };
    }
}
