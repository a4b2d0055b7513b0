//! Session-bound leases: a lease that also ends the moment the session that took it ends.
//!
//! The holder's backend keeps a session-level advisory lock (class 28776) on a *session lock id*,
//! which the lease row records with the backend's pid. PostgreSQL drops the lock when the session
//! ends, however it ends: disconnect, pg_terminate_backend, a crash. So "is the holder's session
//! alive?" is "is that lock still held?", which anyone can ask without waiting (`state::session_lock`).
//! One lock serves all of a session's leases and stays until the session ends.
//!
//! The id mixes backend_start, which tells apart two backends that had the same pid, with a
//! generation that counts how often this backend had to take its lock.
//! pg_advisory_unlock_all(), and so DISCARD ALL, drop the lock, and with it the session's
//! session-bound leases; a later session-bound grant takes a lock with the next generation, so those
//! ended leases stay ended. Behind a pooler in transaction mode the "session" is a shared server
//! connection, which is why session-bound leases need a direct or session-pooled connection.
use super::wakeups;
use crate::leases::state::rows;
use crate::leases::state::session_lock::{tag, HOLDER_MODE};
use crate::locks::key_hash;
use crate::pg::compat;
use crate::stats::{self, Counter};
use pgrx::prelude::*;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

thread_local! {
    /// Keys this session holds (or held) session-bound, with their hashes: their waiters are woken
    /// when it exits, when hashing a key (which reads the catalogs) is no longer possible.
    static BOUND_KEYS: RefCell<BTreeMap<String, u64>> = const { RefCell::new(BTreeMap::new()) };
    static GENERATION: Cell<u32> = const { Cell::new(0) };
    static EXIT_HOOK_SET: Cell<bool> = const { Cell::new(false) };
}

/// Makes sure this session holds its session lock and returns what a lease row records of it:
/// (pid, session lock id). Called before a session-bound grant.
pub fn hold_session_lock() -> (i32, i64) {
    // SAFETY: set once at backend start.
    let pid = unsafe { pg_sys::MyProcPid };
    let mut id = session_id(GENERATION.get());
    // SAFETY: LockHeldByMe reads this backend's own lock table. The session-level LockAcquire is
    // what pg_advisory_lock() does; it may wait an instant for a `holder_alive` probe of the same
    // id (probes never wait), and the lock survives the transaction whatever its outcome.
    unsafe {
        if !compat::lock_held_by_me(&tag(pid, id), HOLDER_MODE) {
            GENERATION.set(GENERATION.get().wrapping_add(1));
            id = session_id(GENERATION.get());
            pg_sys::LockAcquire(&tag(pid, id), HOLDER_MODE, true, false);
        }
        if !EXIT_HOOK_SET.replace(true) {
            pg_sys::before_shmem_exit(Some(count_held_at_exit), pg_sys::Datum::from(0));
            pg_sys::on_shmem_exit(Some(wake_waiters_at_exit), pg_sys::Datum::from(0));
        }
    }
    (pid, id)
}

/// Remembers that this session took `key` session-bound, to wake its waiters when it exits.
pub fn bound(key: &str) {
    BOUND_KEYS.with_borrow_mut(|keys| keys.insert(key.to_owned(), key_hash::of(key)));
}

/// This session released `key`: nobody to wake for it at exit.
pub fn unbound(key: &str) {
    BOUND_KEYS.with_borrow_mut(|keys| keys.remove(key));
}

/// 16 bits of backend_start (in microseconds) and 16 of the generation: two backends that had the
/// same pid almost surely differ in the first, and a lease ended by dropping the lock would need
/// 65,536 more drops, while still unexpired, for its id to come back.
fn session_id(generation: u32) -> i64 {
    // SAFETY: set once at backend start.
    let started = unsafe { pg_sys::MyStartTimestamp } as u64;
    i64::from(((started as u32) << 16) | (generation & 0xffff))
}

/// Counts, as the session exits, the session-bound leases it still holds (fence.stats.session_ends):
/// not those it released, rolled back, or lost to expiry or revocation. It runs before PostgreSQL
/// ends the session's transaction and drops its locks (before_shmem_exit callbacks run in reverse
/// order of registration, and PostgreSQL registered its own at connection), in a transaction of its
/// own, as PostgreSQL's clean-up of temporary tables does at exit.
#[pg_guard]
unsafe extern "C-unwind" fn count_held_at_exit(_code: std::ffi::c_int, _arg: pg_sys::Datum) {
    let keys: Vec<String> = BOUND_KEYS.with_borrow(|keys| keys.keys().cloned().collect());
    if keys.is_empty() || !stats::counting() {
        return;
    }
    let session = (pg_sys::MyProcPid, session_id(GENERATION.get()));
    pg_sys::AbortOutOfAnyTransaction();
    pg_sys::StartTransactionCommand();
    // An error now would be FATAL (PostgreSQL raises every error during exit so), which no catch
    // stops: not a word about damaged state when the extension was dropped meanwhile.
    let installed = crate::pg::installed::table(c"lease_state").is_some();
    let now = crate::pg::clock::now();
    let ours = |key: &&String| rows::live(key, now).any(|lease| lease.session == Some(session));
    let held = if installed { keys.iter().filter(ours).count() } else { 0 };
    pg_sys::CommitTransactionCommand();
    stats::add(Counter::SessionEnds, held as u64);
}

/// Runs at backend exit after PostgreSQL has dropped the session's locks (on_shmem_exit callbacks
/// run after the before_shmem_exit one that releases advisory locks), so woken waiters find the
/// holder's session gone.
#[pg_guard]
unsafe extern "C-unwind" fn wake_waiters_at_exit(_code: std::ffi::c_int, _arg: pg_sys::Datum) {
    let keys = BOUND_KEYS.take();
    keys.values().for_each(|&hash| wakeups::wake(hash));
}
