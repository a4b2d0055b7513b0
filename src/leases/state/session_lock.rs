//! The session lock behind a session-bound lease (see `line::sessions`): a session-level advisory
//! lock (class 28776) on a *session lock id*, which the lease row records with the backend's pid.
//! PostgreSQL drops it when the session ends, however it ends, so "is the holder's session alive?"
//! is "is that lock still held?", which anyone can ask without waiting (`alive`). Every read of a
//! lease asks it of a session-bound one.
use crate::locks::keylock::{self, Owner, SESSION_CLASS};
use crate::pg::compat;
use pgrx::prelude::*;

pub const HOLDER_MODE: pg_sys::LOCKMODE = pg_sys::ExclusiveLock as pg_sys::LOCKMODE;
const PROBE_MODE: pg_sys::LOCKMODE = pg_sys::ShareLock as pg_sys::LOCKMODE;

/// Whether the session lock `id` of backend `pid`, recorded by a session-bound lease, is still held.
/// Called from the statements that judge liveness (a plain lease has NULLs there, and gets NULL).
#[pg_extern(volatile, strict, parallel_unsafe)]
fn holder_alive(pid: i32, id: i64) -> bool {
    alive(pid, id)
}

/// holder_alive, for the liveness check that runs without a statement (`table_rows`, `memory`).
pub fn alive(pid: i32, id: i64) -> bool {
    let tag = tag(pid, id);
    // SAFETY: set once at backend start.
    if pid == unsafe { pg_sys::MyProcPid } {
        // Our own lock never conflicts with our probe: ask whether we still hold it.
        // SAFETY: reads this backend's own lock table.
        return unsafe { compat::lock_held_by_me(&tag, HOLDER_MODE) };
    }
    let orphaned = keylock::acquire(&tag, PROBE_MODE, Owner::Subtransaction, true);
    if orphaned {
        keylock::release(&tag, PROBE_MODE, Owner::Subtransaction);
    }
    !orphaned
}

/// In pg_locks: database, then the pid in classid and the session lock id in objid.
pub fn tag(pid: i32, id: i64) -> pg_sys::LOCKTAG {
    let mut tag = keylock::tag(SESSION_CLASS, 0);
    tag.locktag_field2 = pid as u32;
    tag.locktag_field3 = id as u32;
    tag
}
