//! What a transaction that grants or renews a lease must guarantee.
//!
//! A grant that a client has seen must survive a crash and a failover, or the same fence could be
//! handed out twice. So the granting transaction must commit with at least synchronous_commit = on:
//! flushed locally and, where synchronous replication is configured, on the synchronous standby.
//! A session that chose `off`, `local` or `remote_write` is raised to `on` for this transaction only;
//! a stricter setting (`remote_apply`) is kept. Releasing needs no such guarantee: a release lost in a
//! crash only leaves the lease to expire at its TTL, which is always safe.
use crate::errors;
use pgrx::pg_sys;

/// Refuses to go on in a read-only transaction or on a standby, before anything is locked.
pub fn require_writable(what: &str) {
    // SAFETY: plain reads of backend-global state.
    let (read_only, in_recovery) = unsafe { (pg_sys::XactReadOnly, pg_sys::RecoveryInProgress()) };
    if read_only || in_recovery {
        errors::read_only(what, in_recovery);
    }
}

pub fn require_durable_commit() {
    // SAFETY: synchronous_commit is the backend's current GUC value.
    let level = unsafe { pg_sys::synchronous_commit } as u32;
    if level < pg_sys::SyncCommitLevel::SYNCHRONOUS_COMMIT_REMOTE_FLUSH {
        // SAFETY: what `SELECT set_config('synchronous_commit', 'on', true)` does.
        unsafe {
            pg_sys::set_config_option(
                c"synchronous_commit".as_ptr(),
                c"on".as_ptr(),
                pg_sys::GucContext::PGC_USERSET,
                pg_sys::GucSource::PGC_S_SESSION,
                pg_sys::GucAction::GUC_ACTION_LOCAL,
                true,
                0,
                false,
            );
        }
    }
}
