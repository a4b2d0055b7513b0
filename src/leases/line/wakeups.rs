//! Wake-ups: whoever ends or changes a key's lease wakes, once its transaction has committed, the
//! head of the key's waiting room (see `waiting`) and the key's observers (see
//! `calls::observe`), found by the locks they hold (no shared memory of pg_fence's own).
//!
//! An observer holds the key's *observer lock* (AccessShareLock, class 28778, on the key's hash)
//! while it waits, which observers share and nobody else takes: so it holds up no acquirer,
//! holder, guard or other observer.
use crate::locks::key_hash;
use crate::locks::keylock::{self, Owner, OBSERVER_CLASS, WAITING_ROOM_CLASS};
use crate::pg::compat;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::{register_xact_callback, PgTryBuilder, PgXactCallbackEvent};
use std::cell::{Cell, RefCell};

const OBSERVER_MODE: pg_sys::LOCKMODE = pg_sys::AccessShareLock as pg_sys::LOCKMODE;

thread_local! {
    /// The rooms (by key hash) of the keys whose lease this transaction ended, whose heads are to be
    /// woken when it commits. Hashes, not keys: hashing reads the catalogs, which the callback that
    /// wakes them, running after the commit, may no longer do.
    static WAKE_AT_COMMIT: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    /// Whether `wake_after_commit` is registered in this backend (it stays registered).
    static WAKER_REGISTERED: Cell<bool> = const { Cell::new(false) };
}

/// Wakes the key's head waiter and its observers (see `calls::observe`), whoever holds their locks once the
/// current transaction has committed; a rollback wakes nobody. Whoever takes those locks later reads
/// the change committed, and needs no wake-up.
pub fn wake_at_commit(key: &str) {
    // The callbacks are registered with the first key of the transaction, and only then.
    let hash = key_hash::of(key);
    let first = WAKE_AT_COMMIT.with_borrow_mut(|rooms| {
        let first = rooms.is_empty();
        if !rooms.contains(&hash) {
            rooms.push(hash);
        }
        first
    });
    if first {
        if !WAKER_REGISTERED.replace(true) {
            // SAFETY: a callback for the life of the backend; it does nothing but in the one phase.
            unsafe { pg_sys::RegisterResourceReleaseCallback(Some(wake_after_commit), std::ptr::null_mut()) };
        }
        // A prepared transaction commits later, elsewhere: its waiters wake at their next timeout.
        // PREPARE releases resources as a commit does, so its keys must be gone by then; a rollback
        // is left to `wake_after_commit`, which drops them.
        register_xact_callback(PgXactCallbackEvent::Prepare, || drop(WAKE_AT_COMMIT.take()));
    }
}

/// Wakes the heads of `wake_at_commit`'s keys once the transaction has committed *and* released its
/// locks: the last step of a commit that a callback can follow. Woken at the commit itself (an
/// XACT_EVENT_COMMIT callback), a head would mostly find the key lock still held by the ending
/// transaction and sleep a second time, queueing for it.
#[pg_guard]
unsafe extern "C-unwind" fn wake_after_commit(
    phase: pg_sys::ResourceReleasePhase::Type,
    is_commit: bool,
    is_top_level: bool,
    _arg: *mut std::ffi::c_void,
) {
    if phase != pg_sys::ResourceReleasePhase::RESOURCE_RELEASE_AFTER_LOCKS || !is_top_level {
        return;
    }
    let rooms = WAKE_AT_COMMIT.take();
    if is_commit && !rooms.is_empty() {
        // An error now, after the commit, would be a PANIC; a lost wake-up only delays the waiter
        // until it looks again by itself.
        PgTryBuilder::new(|| rooms.iter().for_each(|&hash| wake(hash))).catch_others(|_| ()).execute();
    }
}

/// Sets the latch of whoever is in the key's waiting room. Spurious wake-ups are harmless: the head
/// looks again and goes back to sleep.
/// `hash` is the key's `key_hash::of`, taken while the transaction could still read the catalogs.
pub fn wake(hash: u64) {
    let observers = room_holders(observer_tag(hash));
    for slot in room_holders(keylock::tag(WAITING_ROOM_CLASS, hash)).into_iter().chain(observers) {
        // SAFETY: setting another backend's latch is how PostgreSQL itself wakes it; a backend
        // that has exited in the meantime leaves a latch nobody waits on.
        unsafe {
            let proc = compat::proc_of(slot);
            if !proc.is_null() {
                pg_sys::SetLatch(&mut (*proc).procLatch);
            }
        }
    }
}

/// The backends (other than this one) holding the key's waiting-room lock.
pub fn room_holders(room: pg_sys::LOCKTAG) -> Vec<compat::ProcSlot> {
    let mut count = 0;
    // SAFETY: GetLockConflicts lists, in a palloc'd array of `count`, the virtual transaction ids
    // of the lock's holders other than this backend (it takes the lock partition's LWLock itself).
    unsafe {
        let holders =
            pg_sys::GetLockConflicts(&room, pg_sys::AccessExclusiveLock as pg_sys::LOCKMODE, &mut count);
        (0..usize::try_from(count).unwrap_or(0))
            .filter_map(|i| compat::holder_slot(&*holders.add(i)))
            .collect()
    }
}

fn observer_tag(hash: u64) -> pg_sys::LOCKTAG {
    keylock::tag(OBSERVER_CLASS, hash)
}

/// Observes the key with this hash (see the top of this file) until `stop_observing`.
pub fn observe(hash: u64) {
    keylock::acquire(&observer_tag(hash), OBSERVER_MODE, Owner::Subtransaction, false);
}

pub fn stop_observing(hash: u64) {
    keylock::release(&observer_tag(hash), OBSERVER_MODE, Owner::Subtransaction);
}
