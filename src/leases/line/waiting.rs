//! Waiting for a held key (lease_acquire with `wait`): a queue per key in arrival order, and prompt
//! wake-ups when the lease ends (`wakeups`).
//!
//! - The queue is PostgreSQL's lock manager, which grants conflicting requests in arrival order: a
//!   waiter takes the key's *waiting room* lock (ExclusiveLock, class 28775) and queues for it. The
//!   one holding it, the head, tries to grant itself the key; while the key is held, it sleeps on its
//!   latch until the lease expires, its own wait runs out, or someone wakes it. It leaves the room
//!   when its call ends, which hands the room to the next waiter.
//! - Whoever ends a lease wakes the head: lease_release and lease_revoke once their transaction
//!   has committed and let go of its locks (not before: the head would find the lease still held,
//!   or queue for the key lock the ending transaction still holds), the backend of a
//!   session-bound holder when it exits (see `line::sessions`). An expiry needs nobody: the head sleeps
//!   until then. No shared memory is needed: the head is found as the room lock's holder, and a
//!   release with nobody in the room costs one look at the lock table.
//! - Before it reads the lease, the head waits for any change of the key in flight (the key lock in
//!   Change mode), so a release that looked at the room before the head entered it cannot leave
//!   the head asleep.
//! - An acquire without `wait` does not jump the queue: while the room is taken it is refused.
use super::wakeups::room_holders;
use crate::locks::key_hash;
use crate::locks::keylock::{self, Owner, WAITING_ROOM_CLASS};
use crate::pg::errors;
use crate::pg::input;
use crate::pg::spi_plans::execute_first;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::time::Instant;

const ROOM_MODE: pg_sys::LOCKMODE = pg_sys::ExclusiveLock as pg_sys::LOCKMODE;

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
