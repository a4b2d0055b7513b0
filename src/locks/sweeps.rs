//! Sweeps of fast leases' rows in shared memory, and the grants that wait them out. A sweep (the
//! worker's, fence.sweep(), or a grant's freeing of rows to make room) changes a row under its
//! key's lock, as a lease call does; a grant that does not wait counts a key another transaction is
//! changing as held, but a sweep only ends or deletes the row of an ended lease, so the key is free:
//! the grant waits for the sweep instead, as it waits for a sweep's row lock on a lease in a table.
//!
//! A sweep shows itself by a mark beside the key's lock (class `SWEEP_CLASS`, on the key's hash).
//! The mark is a session lock given back after the transaction's own locks (`give_back_marks`): a
//! grant that finds the mark free finds the lock of a key swept before free too, and a grant woken
//! by the mark's release finds the key's lock released.
use super::key_hash;
use super::keylock::{self, Mode, Owner};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::{Cell, RefCell};
use std::time::Instant;

/// Taken by sweeps; the mode a grant probes and waits for it in conflicts with it and not with
/// itself, so that grants never queue behind each other there.
const SWEEPING: pg_sys::LOCKMODE = pg_sys::RowExclusiveLock as pg_sys::LOCKMODE;
const PROBE_MODE: pg_sys::LOCKMODE = pg_sys::ShareLock as pg_sys::LOCKMODE;
/// How many sweeps of its key in a row a grant waits out before it counts the key as held.
pub const WAITED_OUT: usize = 3;

thread_local! {
    /// The marks this backend holds, one entry per acquisition, with the transaction nesting level
    /// that took each.
    static MARKS: RefCell<Vec<(pg_sys::LOCKTAG, i32)>> = const { RefCell::new(Vec::new()) };
    static CALLBACK_REGISTERED: Cell<bool> = const { Cell::new(false) };
}

/// What a grant's try of a key's lock found.
pub enum Tried {
    Taken,
    /// Another transaction holds the key's lock, and no sweep of the key is under way.
    Held,
    /// A sweep of the key holds its lock: `wait_for_sweep`, then try again.
    Swept,
}

/// Tries the key's lock for a grant, never waiting.
pub fn try_lock_for_grant(key: &str, mode: Mode) -> Tried {
    if keylock::try_lock(key, mode) {
        return Tried::Taken;
    }
    let mark = mark_of(key);
    if !keylock::acquire(&mark, PROBE_MODE, Owner::Subtransaction, true) {
        return Tried::Swept;
    }
    // Holding the probe, no sweep can begin; one that ended gave the key's lock back before its
    // mark: a key still locked now is held by another transaction.
    let taken = keylock::try_lock(key, mode);
    keylock::release(&mark, PROBE_MODE, Owner::Subtransaction);
    if taken {
        Tried::Taken
    } else {
        Tried::Held
    }
}

/// Waits until no sweep of the key holds its mark, or until `deadline` (a waiting acquire's):
/// false then. A sweep's transaction is short (fence.sweep() runs only in a transaction of its
/// own, and a grant's freeing of rows gives its locks back at once); the wait obeys lock_timeout,
/// statement_timeout and query cancel, as a wait for a sweep's row lock does.
pub fn wait_for_sweep(key: &str, deadline: Option<Instant>) -> bool {
    let mark = mark_of(key);
    let ended = match deadline {
        None => keylock::acquire(&mark, PROBE_MODE, Owner::Subtransaction, false),
        Some(deadline) => keylock::acquire_until(&mark, PROBE_MODE, Owner::Subtransaction, deadline),
    };
    if ended {
        keylock::release(&mark, PROBE_MODE, Owner::Subtransaction);
    }
    ended
}

/// `try_lock_for_grant`, waiting out sweeps of the key (a few in a row at most, until `deadline`
/// at most): whether the key's lock is taken. For a grant that holds no other key's lock.
pub fn lock_unless_held(key: &str, mode: Mode, deadline: Option<Instant>) -> bool {
    for _ in 0..WAITED_OUT {
        match try_lock_for_grant(key, mode) {
            Tried::Taken => return true,
            Tried::Held => return false,
            Tried::Swept => {
                if !wait_for_sweep(key, deadline) {
                    return false;
                }
            }
        }
    }
    matches!(try_lock_for_grant(key, mode), Tried::Taken)
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
    // SAFETY: reads the backend's transaction state.
    let level = unsafe { pg_sys::GetCurrentTransactionNestLevel() };
    MARKS.with_borrow_mut(|marks| marks.push((mark, level)));
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
    keylock::tag(keylock::SWEEP_CLASS, key_hash::of(key))
}

fn unmark(mark: &pg_sys::LOCKTAG) {
    MARKS.with_borrow_mut(|marks| {
        if let Some(at) = marks.iter().rposition(|(each, _)| same(each, mark)) {
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

/// Once a transaction's own locks are given back (the keys' among them), at its end: gives back the
/// marks it holds. At a subtransaction's rollback, those it took: a sweep that an error cut short
/// (caught by a PL/pgSQL EXCEPTION block, say) leaves no mark that would keep grants of its key
/// waiting for the rest of the transaction.
#[pg_guard]
unsafe extern "C-unwind" fn give_back_marks(
    phase: pg_sys::ResourceReleasePhase::Type,
    is_commit: bool,
    is_top_level: bool,
    _arg: *mut std::ffi::c_void,
) {
    if phase != pg_sys::ResourceReleasePhase::RESOURCE_RELEASE_AFTER_LOCKS || (!is_top_level && is_commit) {
        return;
    }
    // SAFETY: reads the backend's transaction state.
    let level = if is_top_level { 0 } else { unsafe { pg_sys::GetCurrentTransactionNestLevel() } };
    let ended: Vec<pg_sys::LOCKTAG> = MARKS.with_borrow_mut(|marks| {
        let (ended, kept) = std::mem::take(marks).into_iter().partition(|(_, taken_at)| *taken_at >= level);
        *marks = kept;
        ended.into_iter().map(|(mark, _)| mark).collect()
    });
    for mark in ended {
        // SAFETY: each a session lock this backend took and has not given back.
        unsafe { pg_sys::LockRelease(&mark, SWEEPING, true) };
    }
}
