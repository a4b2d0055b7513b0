//! Session-bound leases: a lease that also ends the moment the session that took it ends.
//!
//! The holder's backend keeps a session-level advisory lock (class 28776) on its own identity, the
//! pair (pid, backend_start) as in pg_stat_activity, which the lease row records. PostgreSQL drops
//! the lock when the session ends, however it ends: disconnect, pg_terminate_backend, a crash. So
//! "is the holder's session alive?" is "is that lock still held?", which anyone can ask without
//! waiting (`holder_alive`). One lock serves all of a session's leases and stays until it ends.
//!
//! pg_advisory_unlock_all(), and so DISCARD ALL, drop the lock too, and with it the session's
//! session-bound leases: fencing keeps that safe (the old holder's fence is stale once another holder
//! takes the key). Behind a pooler in transaction mode the "session" is a shared server connection,
//! which is why session-bound leases need a direct or session-pooled connection.
use crate::keylock::{self, SESSION_CLASS};
use crate::waiting;
use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;
use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;

const HOLDER_MODE: pg_sys::LOCKMODE = pg_sys::ExclusiveLock as pg_sys::LOCKMODE;
const PROBE_MODE: pg_sys::LOCKMODE = pg_sys::ShareLock as pg_sys::LOCKMODE;

thread_local! {
    /// Keys this session holds (or held) session-bound: their waiters are woken when it exits.
    static BOUND_KEYS: RefCell<BTreeSet<String>> = const { RefCell::new(BTreeSet::new()) };
    static EXIT_HOOK_SET: Cell<bool> = const { Cell::new(false) };
}

/// This session's identity as the lease row records it: (pid, backend_start in microseconds).
pub fn this_session() -> (i32, i64) {
    // SAFETY: both are set once at backend start.
    unsafe { (pg_sys::MyProcPid, pg_sys::MyStartTimestamp) }
}

/// Ties `key`'s lease, just granted in this transaction, to this session.
pub fn bind(key: &str) {
    let (pid, started) = this_session();
    let tag = session_tag(pid, started);
    // SAFETY: LockHeldByMe reads this backend's own lock table; a session-level LockAcquire is
    // what pg_try_advisory_lock() does, and survives the transaction whatever its outcome.
    unsafe {
        if !pg_sys::LockHeldByMe(&tag, HOLDER_MODE)
            && pg_sys::LockAcquire(&tag, HOLDER_MODE, true, true)
                == pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL
        {
            panic!("the session lock of backend {pid} is held by another backend");
        }
        if !EXIT_HOOK_SET.replace(true) {
            pg_sys::on_shmem_exit(Some(wake_waiters_at_exit), pg_sys::Datum::from(0));
        }
    }
    BOUND_KEYS.with_borrow_mut(|keys| keys.insert(key.to_owned()));
}

/// This session no longer holds `key` (it released it): nobody to wake for it at exit.
pub fn unbind(key: &str) {
    BOUND_KEYS.with_borrow_mut(|keys| keys.remove(key));
}

/// Whether the session (pid, backend_start) that took a session-bound lease is still connected.
/// Called from the statements that judge liveness (a NULL session, for a plain lease, gives NULL).
#[pg_extern(volatile, strict, parallel_unsafe)]
fn holder_alive(pid: i32, started: TimestampWithTimeZone) -> bool {
    let started = pg_sys::TimestampTz::from(started);
    let tag = session_tag(pid, started);
    if (pid, started) == this_session() {
        // Our own lock never conflicts with our probe: ask whether we still hold it.
        // SAFETY: reads this backend's own lock table.
        return unsafe { pg_sys::LockHeldByMe(&tag, HOLDER_MODE) };
    }
    let orphaned = keylock::acquire(&tag, PROBE_MODE, true);
    if orphaned {
        keylock::release(&tag, PROBE_MODE);
    }
    !orphaned
}

/// The low 32 bits of backend_start (in microseconds) tell apart two backends that had the same pid.
fn session_tag(pid: i32, started: i64) -> pg_sys::LOCKTAG {
    keylock::tag(SESSION_CLASS, (u64::from(pid as u32) << 32) | (started as u64 & 0xffff_ffff))
}

/// Runs at backend exit after PostgreSQL has dropped the session's locks (on_shmem_exit callbacks
/// run after the before_shmem_exit one that releases advisory locks), so woken waiters find the
/// holder's session gone.
#[pg_guard]
unsafe extern "C-unwind" fn wake_waiters_at_exit(_code: std::ffi::c_int, _arg: pg_sys::Datum) {
    BOUND_KEYS.take().iter().for_each(|key| waiting::wake(key));
}
