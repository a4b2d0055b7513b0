//! What each kind of change needs at commit.
//!
//! A grant (and a renewal) that a client has seen must survive a crash and a failover, or the same
//! fence could be handed out twice, or a holder could believe in a lease the server forgot. So such a
//! transaction commits with at least synchronous_commit = on: flushed locally and, where synchronous
//! replication is configured, on the synchronous standby. The level is raised at PRE_COMMIT, after
//! all of the caller's own code has run, so no later `SET LOCAL synchronous_commit = off` (nor a
//! wrapper function's SET clause) can undo it. A stricter `remote_apply` is kept.
//!
//! A release, or an acquire that was refused, needs no flush at all: lost in a crash, a release only
//! leaves the lease to run out its TTL, and a refusal changed nothing. And the next grant of the key
//! flushes the WAL up to its own commit, which includes that release. So when such a change is all
//! that its transaction writes, the commit is made asynchronous, sparing a WAL flush (half the
//! flushes of an acquire+release pair). Any other write in the transaction, before or after, keeps the
//! session's setting untouched.
use crate::pg::errors;
use crate::pg::settings;
use pgrx::pg_sys;
use pgrx::{register_xact_callback, PgXactCallbackEvent};
use std::cell::Cell;

thread_local! {
    /// Whether the current transaction granted or renewed a lease; reset when it ends.
    static DURABLE_COMMIT_REQUIRED: Cell<bool> = const { Cell::new(false) };
}

/// Refuses to go on in a read-only transaction or on a standby, before anything is locked.
pub fn require_writable(what: &str) {
    // SAFETY: plain reads of backend-global state.
    let (read_only, in_recovery) = unsafe { (pg_sys::XactReadOnly, pg_sys::RecoveryInProgress()) };
    if read_only || in_recovery {
        errors::read_only(what, in_recovery);
    }
}

/// Makes the current transaction's commit wait for the flush (and the synchronous standby).
pub fn require_durable_commit() {
    if DURABLE_COMMIT_REQUIRED.replace(true) {
        return; // already arranged for this transaction
    }
    register_xact_callback(PgXactCallbackEvent::PreCommit, || {
        if sync_level() < pg_sys::SyncCommitLevel::SYNCHRONOUS_COMMIT_REMOTE_FLUSH {
            set_local_synchronous_commit(c"on");
        }
    });
    // PREPARE TRANSACTION always flushes; COMMIT PREPARED runs later, in another transaction.
    for end in [PgXactCallbackEvent::Commit, PgXactCallbackEvent::Abort, PgXactCallbackEvent::Prepare] {
        register_xact_callback(end, || DURABLE_COMMIT_REQUIRED.set(false));
    }
}

/// For a release or a refusal, given `wal_position()` from before it: if the transaction had
/// written no WAL before the change and writes none after it, its commit skips the flush.
pub fn skip_flush_if_alone(position_before_change: u64) {
    if position_before_change != 0 {
        return;
    }
    let position_after_change = wal_position();
    register_xact_callback(PgXactCallbackEvent::PreCommit, move || {
        let nothing_written_since = wal_position() == position_after_change;
        let strictest_we_lower = pg_sys::SyncCommitLevel::SYNCHRONOUS_COMMIT_REMOTE_FLUSH;
        let durable_required = DURABLE_COMMIT_REQUIRED.get();
        if nothing_written_since && !durable_required && sync_level() <= strictest_we_lower {
            set_local_synchronous_commit(c"off");
        }
    });
}

/// End of the last WAL record this transaction wrote; 0 when it has written none (PostgreSQL
/// resets it when each transaction ends). Taken before a change for `skip_flush_if_alone`.
pub fn wal_position() -> u64 {
    // SAFETY: backend-global, maintained by XLogInsert.
    unsafe { pg_sys::XactLastRecEnd }
}

fn sync_level() -> u32 {
    // SAFETY: the backend's current value of the synchronous_commit GUC.
    unsafe { pg_sys::synchronous_commit as u32 }
}

/// `SET LOCAL synchronous_commit = value`: PostgreSQL restores the session's value at transaction end.
fn set_local_synchronous_commit(value: &std::ffi::CStr) {
    settings::set_server_setting(c"synchronous_commit", value, pg_sys::GucAction::GUC_ACTION_LOCAL);
}
