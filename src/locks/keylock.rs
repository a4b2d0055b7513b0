//! pg_fence's locks: PostgreSQL advisory locks in classes of their own (column objsubid of pg_locks),
//! so they never collide with an application's pg_advisory_lock calls (objsubid 1 and 2).
//!
//! | class          | objsubid | locks                        | see                     |
//! |----------------|---------:|------------------------------|-------------------------|
//! | key lock       | 28774    | one key's changes            | this file               |
//! | waiting room   | 28775    | one key's waiters            | `leases::line::waiting` |
//! | session        | 28776    | one holder backend           | `leases::state::session_lock` |
//! | guard lock     | 28777    | writes of some holders       | this file               |
//! | observer       | 28778    | one key's observers          | `leases::line::wakeups` |
//! | candidate      | 28779    | a key's waiters of one owner | `leases::calls::handoff` |
//! | reset marker   | 28780    | the reset marker's floor     | `leases::state::fences` |
//! | sweep mark     | 28781    | one key's sweeps             | `sweeps`                |
//!
//! The key lock, on a keyed 64-bit hash of the key (`key_hash`), is held until the end of the
//! top-level transaction that takes it, in one of three modes, so that each kind of call waits only
//! for what it must:
//!
//! | mode       | taken by              | PostgreSQL lock mode      | waits for             |
//! |------------|-----------------------|---------------------------|-----------------------|
//! | `Grant`    | lease_acquire         | ExclusiveLock             | everything below      |
//! | `Change`   | lease_renew, release  | ShareUpdateExclusiveLock  | grants, other changes |
//! | `Guard`    | fence_guard & writes  | RowShareLock              | grants                |
//!
//! So changes to one key happen one at a time and each sees the previous one committed; a new grant
//! waits until every transaction that wrote under the old fence has ended (the guard); and guards
//! never hold up the holder's own renew or release.
//!
//! A sweep of a fast lease's row in shared memory (fence.sweep(), or a grant that frees rows to
//! make room) takes the key lock in `Change` mode too, with the key's sweep mark: a
//! grant that does not wait counts a key another transaction is changing as held, but waits out a
//! sweep, as it waits for a sweep's row lock on a lease in a table (`sweeps`).
//!
//! A key with several holders (shared leases, semaphores: see `leases::state::mode`) needs more than one
//! guard lock, so that a grant waits for the writers of the holders it replaces and no others. Its
//! grants other than exclusive ones take the key lock in `Change` mode, which guards do not
//! conflict with, and then, in `Grant` mode, the guard locks of the holders they replace
//! (`GuardLock`): slot 0's is the key lock itself, so an exclusive lease is locked as it always
//! was; slot s's and the shared holders' one are locks of class 28777 on keyed hashes of the key
//! and the slot. Waits obey lock_timeout, statement_timeout and
//! query cancel, and take part in deadlock detection.
//!
//! A key lock belongs to the top-level transaction, not to the subtransaction that took it (the
//! owner PostgreSQL's own pg_advisory_xact_lock would use): a guard taken in a PL/pgSQL EXCEPTION
//! block or after a SAVEPOINT must hold until the writes made under it commit, even when that
//! subtransaction rolls back and a later one writes. Two locks are different. The waiting room's
//! only orders waiters, so it belongs to the call's own subtransaction, and an error that ends the
//! call lets the next waiter in. And fenced_update's guard guards only the write it makes itself,
//! in the same subtransaction, so its lock belongs to that subtransaction too (src/writes/fencing.rs).
use crate::locks::key_hash;
use crate::pg::clock;
use crate::pg::compat;
use crate::pg::settings;
use pgrx::pg_sys;
use pgrx::pg_sys::panic::CaughtError;
use pgrx::{PgSqlErrorCode, PgTryBuilder};
use std::time::Instant;

/// A slot whose writers a grant must wait for, before it commits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum GuardLock {
    /// The lock of one slot: an exclusive holder's, or a semaphore holder's.
    Slot(i32),
    /// The lock every shared holder of the key guards with.
    Shared,
}

pub const KEY_LOCK_CLASS: u16 = 0x7066;
pub const WAITING_ROOM_CLASS: u16 = 0x7067;
pub const SESSION_CLASS: u16 = 0x7068;
pub const GUARD_LOCK_CLASS: u16 = 0x7069;
pub const OBSERVER_CLASS: u16 = 0x706A;
pub const CANDIDATE_CLASS: u16 = 0x706B;
pub const RESET_MARKER_CLASS: u16 = 0x706C;
pub const SWEEP_CLASS: u16 = 0x706D;

#[derive(Clone, Copy)]
pub enum Mode {
    Grant,
    Change,
    Guard,
}

impl Mode {
    fn lockmode(self) -> pg_sys::LOCKMODE {
        (match self {
            Mode::Grant => pg_sys::ExclusiveLock,
            Mode::Change => pg_sys::ShareUpdateExclusiveLock,
            Mode::Guard => pg_sys::RowShareLock,
        }) as pg_sys::LOCKMODE
    }
}

/// Who a lock belongs to, and so when PostgreSQL gives it back by itself.
#[derive(Clone, Copy)]
pub enum Owner {
    /// The top-level transaction: held until it commits or rolls back, whatever its
    /// subtransactions do.
    TopTransaction,
    /// The current subtransaction (or the transaction, outside any): its rollback gives it back.
    Subtransaction,
}

/// The tag of `key`'s lock.
fn key_tag(key: &str) -> pg_sys::LOCKTAG {
    tag(KEY_LOCK_CLASS, key_hash::of(key))
}

/// The tag of one of `key`'s guard locks (see `leases::state::mode`).
pub fn guard_tag(key: &str, lock: GuardLock) -> pg_sys::LOCKTAG {
    match lock {
        GuardLock::Slot(0) => key_tag(key),
        GuardLock::Slot(slot) => tag(GUARD_LOCK_CLASS, key_hash::of_slot(key, slot)),
        GuardLock::Shared => tag(GUARD_LOCK_CLASS, key_hash::of_slot(key, -1)),
    }
}

/// Waits for and takes one of the key's guard locks for `owner`; returns its tag (for `release`
/// with `Mode::Guard`'s lock mode).
pub fn lock_guard(key: &str, lock: GuardLock, owner: Owner) -> pg_sys::LOCKTAG {
    let tag = guard_tag(key, lock);
    acquire(&tag, Mode::Guard.lockmode(), owner, false);
    tag
}

/// Gives back a `lock_guard`.
pub fn unlock_guard(tag: &pg_sys::LOCKTAG, owner: Owner) {
    release(tag, Mode::Guard.lockmode(), owner);
}

/// For a grant: takes these guard locks of the key in `Grant` mode, in order, until the end of the
/// top-level transaction; at once or not at all without a deadline, else waiting until it at most.
/// False, with none of them held, when one could not be taken.
pub fn lock_guards_for_grant(key: &str, locks: &[GuardLock], deadline: Option<Instant>) -> bool {
    let lockmode = Mode::Grant.lockmode();
    for (taken, lock) in locks.iter().enumerate() {
        let tag = guard_tag(key, *lock);
        let got = match deadline {
            None => acquire(&tag, lockmode, Owner::TopTransaction, true),
            Some(deadline) => acquire_until(&tag, lockmode, Owner::TopTransaction, deadline),
        };
        if !got {
            unlock_guards_for_grant(key, &locks[..taken]);
            return false;
        }
    }
    true
}

/// Gives back `lock_guards_for_grant`'s locks.
pub fn unlock_guards_for_grant(key: &str, locks: &[GuardLock]) {
    locks
        .iter()
        .for_each(|lock| release(&guard_tag(key, *lock), Mode::Grant.lockmode(), Owner::TopTransaction));
}

/// Waits for and takes the key's lock until the end of the top-level transaction.
pub fn lock(key: &str, mode: Mode) {
    acquire(&key_tag(key), mode.lockmode(), Owner::TopTransaction, false);
}

/// Takes the key's lock if no other transaction's lock conflicts; false (nothing taken) otherwise.
pub fn try_lock(key: &str, mode: Mode) -> bool {
    acquire(&key_tag(key), mode.lockmode(), Owner::TopTransaction, true)
}

/// Like `lock`, but gives up at `deadline`: false then, nothing taken.
pub fn lock_until(key: &str, mode: Mode, deadline: Instant) -> bool {
    acquire_until(&key_tag(key), mode.lockmode(), Owner::TopTransaction, deadline)
}

/// Whether this transaction holds the key's lock, in any mode.
pub fn held_by_me(key: &str) -> bool {
    let tag = key_tag(key);
    // SAFETY: reads this backend's own lock table.
    [Mode::Grant, Mode::Change, Mode::Guard]
        .iter()
        .any(|mode| unsafe { compat::lock_held_by_me(&tag, mode.lockmode()) })
}

/// Whether this backend holds the key's guard lock `lock` as a writer does (Guard mode).
pub fn guard_held_by_me(key: &str, lock: GuardLock) -> bool {
    // SAFETY: reads this backend's own lock table.
    unsafe { compat::lock_held_by_me(&guard_tag(key, lock), Mode::Guard.lockmode()) }
}

/// Gives back one `lock`/`try_lock` of this transaction, for a call that changed nothing: it need
/// not hold others up until its transaction ends. A lock the transaction took earlier stays held.
pub fn unlock(key: &str, mode: Mode) {
    release(&key_tag(key), mode.lockmode(), Owner::TopTransaction);
}

/// An advisory lock tag in this database: `class` in objsubid, `id` in objid (low) and classid (high).
pub fn tag(class: u16, id: u64) -> pg_sys::LOCKTAG {
    pg_sys::LOCKTAG {
        // SAFETY: MyDatabaseId is set for the whole life of a backend connected to a database.
        locktag_field1: unsafe { pg_sys::MyDatabaseId }.to_u32(),
        locktag_field2: (id >> 32) as u32,
        locktag_field3: id as u32,
        locktag_field4: class,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    }
}

/// Takes a transaction-level lock for `owner`; with `dont_wait`, only if it is free (false
/// otherwise).
pub fn acquire(tag: &pg_sys::LOCKTAG, lockmode: pg_sys::LOCKMODE, owner: Owner, dont_wait: bool) -> bool {
    // SAFETY: the call pg_advisory_xact_lock() makes; errors (cancel, timeout, deadlock) are
    // raised by PostgreSQL and turned into Rust panics by pgrx's FFI guard.
    let result = as_owner(owner, || unsafe { pg_sys::LockAcquire(tag, lockmode, false, dont_wait) });
    result != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL
}

/// Gives back one acquisition of a transaction-level lock, made for the same `owner`.
pub fn release(tag: &pg_sys::LOCKTAG, lockmode: pg_sys::LOCKMODE, owner: Owner) {
    // SAFETY: releases one acquisition this transaction made (PostgreSQL counts them).
    as_owner(owner, || unsafe { pg_sys::LockRelease(tag, lockmode, false) });
}

/// Takes a transaction-level lock, waiting in the lock's queue (in arrival order) until `deadline`
/// at most: false when the deadline passed first, with nothing taken and nothing left behind.
/// `deadline` is on the monotonic clock, so a step of the server's clock neither shortens nor
/// stretches the wait (but see `acquire_within_ms`).
///
/// PostgreSQL has no lock wait with a timeout other than lock_timeout, which ends the wait with an
/// error; so the wait runs in a subtransaction, as a PL/pgSQL EXCEPTION block would, whose rollback
/// takes the waiter out of the queue. Any other error (cancel, statement_timeout) is raised again
/// after the subtransaction is rolled back, as PL/pgSQL does: left open, it would leave even an
/// implicit transaction in the state of an explicit block awaiting ROLLBACK.
pub fn acquire_until(
    tag: &pg_sys::LOCKTAG,
    lockmode: pg_sys::LOCKMODE,
    owner: Owner,
    deadline: Instant,
) -> bool {
    loop {
        if acquire(tag, lockmode, owner, true) {
            return true;
        }
        let remaining_ms = clock::millis_rounded_up(clock::micros_until(deadline));
        if remaining_ms <= 0 {
            return false;
        }
        // SAFETY: the backend's current lock_timeout, in milliseconds (0: none).
        let users_timeout = i64::from(unsafe { pg_sys::LockTimeout });
        if users_timeout > 0 && users_timeout <= remaining_ms {
            // The caller's own lock_timeout ends the wait first: let it, with its usual error.
            acquire(tag, lockmode, owner, false);
            return true;
        }
        // lock_timeout takes at most i32::MAX ms (24.8 days): a longer wait goes round again.
        if acquire_within_ms(tag, lockmode, owner, remaining_ms.min(i64::from(i32::MAX))) {
            return true;
        }
    }
}

/// One wait of at most `timeout_ms`, through lock_timeout. PostgreSQL times it by the wall clock
/// (utils/misc/timeout.c): a step back of the server's clock during this wait stretches it by the
/// step. The latch sleeps of a waiting acquire (`waiting::sleep`) do not have that weakness.
fn acquire_within_ms(
    tag: &pg_sys::LOCKTAG,
    lockmode: pg_sys::LOCKMODE,
    owner: Owner,
    timeout_ms: i64,
) -> bool {
    let lock_timeout = std::ffi::CString::new(timeout_ms.to_string()).unwrap();
    // SAFETY: the sequence PL/pgSQL's exec_stmt_block uses around an EXCEPTION block: the memory
    // context and resource owner are restored on both paths, and the subtransaction is rolled back
    // before any error other than our lock timeout is raised again.
    unsafe {
        let memory = pg_sys::CurrentMemoryContext;
        let resource_owner = pg_sys::CurrentResourceOwner;
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(memory);
        let taken = PgTryBuilder::new(|| {
            let guc_level = pg_sys::NewGUCNestLevel();
            settings::set_server_setting(c"lock_timeout", &lock_timeout, pg_sys::GucAction::GUC_ACTION_SAVE);
            // Waited for as the subtransaction's own: if the wait ends in an error at the instant
            // the lock is granted (our lock_timeout, a cancel), PostgreSQL grants it to the waiting
            // owner while cleaning up, and the subtransaction's rollback must then let it go.
            as_owner(Owner::Subtransaction, || pg_sys::LockAcquire(tag, lockmode, false, false));
            forget_late_lock_timeout();
            pg_sys::AtEOXact_GUC(true, guc_level);
            pg_sys::ReleaseCurrentSubTransaction();
            true
        })
        .catch_others(|error| {
            pg_sys::MemoryContextSwitchTo(memory);
            pg_sys::RollbackAndReleaseCurrentSubTransaction();
            match &error {
                CaughtError::PostgresError(report)
                    if report.sql_error_code() == PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE =>
                {
                    false
                }
                _ => error.rethrow(),
            }
        })
        .execute();
        pg_sys::MemoryContextSwitchTo(memory);
        pg_sys::CurrentResourceOwner = resource_owner;
        if taken && matches!(owner, Owner::TopTransaction) {
            // The released subtransaction handed the lock to the caller's: hand it on to the
            // top-level transaction (held already, so granted at once) and drop the caller's count.
            acquire(tag, lockmode, Owner::TopTransaction, true);
            release(tag, lockmode, Owner::Subtransaction);
        }
        taken
    }
}

unsafe extern "C-unwind" {
    /// utils/timeout.h, which pgrx does not bind. It raises no errors.
    fn get_timeout_indicator(id: std::ffi::c_int, reset_indicator: bool) -> bool;
}

/// TimeoutId LOCK_TIMEOUT in PostgreSQL 15's utils/timeout.h.
const LOCK_TIMEOUT_ID: std::ffi::c_int = 2;

/// The lock was granted, but our lock_timeout may have fired in the same instant: PostgreSQL then
/// has already signalled a cancel (SIGINT to itself), which the next CHECK_FOR_INTERRUPTS would
/// raise as "canceling statement due to lock timeout", after we took the lock. Forget both. (A
/// user's cancel arriving in that same instant is forgotten too; it can be sent again.)
fn forget_late_lock_timeout() {
    // SAFETY: reads and resets backend-local flags that the signal handlers set.
    unsafe {
        if get_timeout_indicator(LOCK_TIMEOUT_ID, true) {
            pg_sys::QueryCancelPending = 0;
        }
    }
}

/// Runs `f` with CurrentResourceOwner set to `owner`'s resource owner, which LockAcquire and
/// LockRelease act for. (Within a waiting subtransaction of `acquire_within_ms`, a Subtransaction
/// lock belongs to that subtransaction, which hands it to its parent when released.)
fn as_owner<T>(owner: Owner, f: impl FnOnce() -> T) -> T {
    // SAFETY: swaps a backend-global pointer for the duration of `f`; an error in `f` aborts the
    // (sub)transaction, which resets CurrentResourceOwner itself.
    unsafe {
        let statement_owner = pg_sys::CurrentResourceOwner;
        pg_sys::CurrentResourceOwner = match owner {
            Owner::TopTransaction => pg_sys::TopTransactionResourceOwner,
            Owner::Subtransaction => pg_sys::CurTransactionResourceOwner,
        };
        let result = f();
        pg_sys::CurrentResourceOwner = statement_owner;
        result
    }
}
