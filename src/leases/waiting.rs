//! Waiting for a held key (lease_acquire with `wait`): a queue per key in arrival order, and prompt
//! wake-ups when the lease ends.
//!
//! - The queue is PostgreSQL's lock manager, which grants conflicting requests in arrival order: a
//!   waiter takes the key's *waiting room* lock (ExclusiveLock, class 28775) and queues for it. The
//!   one holding it, the head, tries to grant itself the key; while the key is held, it sleeps on its
//!   latch until the lease expires, its own wait runs out, or someone wakes it. It leaves the room
//!   when its call ends, which hands the room to the next waiter.
//! - Whoever ends a lease wakes the head: lease_release and lease_revoke once their transaction
//!   has committed and let go of its locks (not before: the head would find the lease still held,
//!   or queue for the key lock the ending transaction still holds), the backend of a
//!   session-bound holder when it exits (see `sessions`). An expiry needs nobody: the head sleeps
//!   until then. No shared memory is needed: the head is found as the room lock's holder, and a
//!   release with nobody in the room costs one look at the lock table.
//! - Before it reads the lease, the head waits for any change of the key in flight (the key lock in
//!   Change mode), so a release that looked at the room before the head entered it cannot leave
//!   the head asleep.
//! - An acquire without `wait` does not jump the queue: while the room is taken it is refused.
use crate::locks::key_hash;
use crate::locks::keylock::{self, Owner, WAITING_ROOM_CLASS};
use crate::pg::compat;
use crate::pg::errors;
use crate::pg::input;
use crate::pg::spi_plans::execute_first;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::{register_xact_callback, PgTryBuilder, PgXactCallbackEvent};
use std::cell::{Cell, RefCell};
use std::time::Instant;

const ROOM_MODE: pg_sys::LOCKMODE = pg_sys::ExclusiveLock as pg_sys::LOCKMODE;

thread_local! {
    /// The rooms (by key hash) of the keys whose lease this transaction ended, whose heads are to be
    /// woken when it commits. Hashes, not keys: hashing reads the catalogs, which the callback that
    /// wakes them, running after the commit, may no longer do.
    static WAKE_AT_COMMIT: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    /// Whether `wake_after_commit` is registered in this backend (it stays registered).
    static WAKER_REGISTERED: Cell<bool> = const { Cell::new(false) };
}

/// A waiter must see each change of the key as it commits. Under REPEATABLE READ or SERIALIZABLE it
/// would keep seeing the key as its snapshot left it, and its grant would fail with 40001 anyway.
pub fn require_read_committed() {
    // SAFETY: the backend's isolation level for the current transaction.
    if unsafe { pg_sys::XactIsoLevel } >= pg_sys::XACT_REPEATABLE_READ as i32 {
        errors::wait_needs_read_committed();
    }
}

/// Queues for the key's waiting room, until `deadline` at most: false when it ran out first.
pub fn enter(key: &str, deadline: Instant) -> bool {
    keylock::acquire_until(&room_of(key), ROOM_MODE, Owner::Subtransaction, deadline)
}

pub fn leave(key: &str) {
    keylock::release(&room_of(key), ROOM_MODE, Owner::Subtransaction);
}

/// Whether someone is in the key's waiting room.
pub fn someone_waiting(key: &str) -> bool {
    !room_holders(room_of(key)).is_empty()
}

/// The backend first in line for the key, if another one is.
pub fn head(key: &str) -> Option<compat::ProcSlot> {
    room_holders(room_of(key)).into_iter().next()
}

/// Forgets earlier wake-ups: call before looking at the key, then `sleep`. A wake-up that comes in
/// between makes `sleep` return at once, so none is lost.
pub fn arm() {
    // SAFETY: MyLatch is this backend's own latch.
    unsafe { pg_sys::ResetLatch(pg_sys::MyLatch) };
}

/// Sleeps until woken or for `micros` at most; query cancel and statement_timeout end it (with
/// their error). Shows in pg_stat_activity as wait_event_type 'Extension'.
pub fn sleep(micros: i64) {
    let timeout_ms = crate::pg::clock::millis_rounded_up(micros).clamp(1, i64::from(i32::MAX));
    let events = pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH;
    // SAFETY: the standard latch wait of a backend; interrupts are processed right after.
    unsafe {
        pg_sys::WaitLatch(pg_sys::MyLatch, events as i32, timeout_ms as _, pg_sys::PG_WAIT_EXTENSION);
    }
    pgrx::check_for_interrupts!();
}

/// Wakes the key's head waiter and its observers (see `observe`), whoever holds their locks once the
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
    let observers = super::observe::observers(hash);
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
pub(super) fn room_holders(room: pg_sys::LOCKTAG) -> Vec<compat::ProcSlot> {
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

/// How many sessions wait for `key` right now, the first in line included: for spotting hot keys.
#[pg_extern(volatile)]
fn waiters(key: Option<&str>) -> i32 {
    let key = input::key(key);
    let room = room_of(key);
    let args = [
        pg_sys::Oid::from(room.locktag_field1).into(),
        pg_sys::Oid::from(room.locktag_field2).into(),
        pg_sys::Oid::from(room.locktag_field3).into(),
        (room.locktag_field4 as i16).into(),
    ];
    execute_first::<i32>(WAITERS, &args).unwrap_or(0)
}

/// The sessions holding or queueing for a waiting-room lock, as pg_locks (readable by all) shows them.
const WAITERS: &str = "
    SELECT count(*)::int FROM pg_catalog.pg_locks
     WHERE locktype = 'advisory' AND database = $1 AND classid = $2 AND objid = $3 AND objsubid = $4";

fn room_of(key: &str) -> pg_sys::LOCKTAG {
    keylock::tag(WAITING_ROOM_CLASS, key_hash::of(key))
}
