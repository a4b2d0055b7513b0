//! The per-key lock: a PostgreSQL advisory lock on a 64-bit hash of the key, held until the end of
//! the transaction that takes it. Three modes, so that each kind of call waits only for what it must:
//!
//! | mode       | taken by              | PostgreSQL lock mode      | waits for             |
//! |------------|-----------------------|---------------------------|-----------------------|
//! | `Grant`    | lease_acquire         | ExclusiveLock             | everything below      |
//! | `Change`   | lease_renew, release  | ShareUpdateExclusiveLock  | grants, other changes |
//! | `Guard`    | fence_guard & writes  | RowShareLock              | grants                |
//!
//! So changes to one key happen one at a time and each sees the previous one committed; a new grant
//! waits until every transaction that wrote under the old fence has ended (the guard); and guards
//! never hold up the holder's own renew or release. Waits obey lock_timeout, statement_timeout and
//! query cancel, and take part in deadlock detection.
use pgrx::pg_sys;

/// Marks pg_fence's advisory locks in pg_locks (column objsubid) and keeps them apart from the
/// locks taken by pg_advisory_lock(bigint) (objsubid 1) and pg_advisory_lock(int, int) (objsubid 2),
/// so an application's own advisory locks never collide with pg_fence's.
pub const KEY_LOCK_CLASS: u16 = 0x7066;

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

/// 64-bit FNV-1a of the key. Fixed forever: backends running two builds of pg_fence side by side
/// (during an upgrade) must still agree on which lock guards a key.
pub fn key_hash(key: &str) -> u64 {
    key.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Waits for and takes the key's lock until the end of the current transaction.
pub fn lock(key: &str, mode: Mode) {
    // SAFETY: the same call pg_advisory_xact_lock() makes; errors (cancel, timeout, deadlock) are
    // raised by PostgreSQL and turned into Rust panics by pgrx's FFI guard.
    unsafe { pg_sys::LockAcquire(&tag(key), mode.lockmode(), false, false) };
}

/// Takes the key's lock if no other transaction's lock conflicts; false (nothing taken) otherwise.
pub fn try_lock(key: &str, mode: Mode) -> bool {
    // SAFETY: as in `lock`, without waiting.
    let result = unsafe { pg_sys::LockAcquire(&tag(key), mode.lockmode(), false, true) };
    result != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL
}

/// Gives back one `lock`/`try_lock` of this transaction, for a call that changed nothing: it need
/// not hold others up until its transaction ends. A lock the transaction took earlier stays held.
pub fn unlock(key: &str, mode: Mode) {
    // SAFETY: releases one acquisition this transaction made (PostgreSQL counts them).
    unsafe { pg_sys::LockRelease(&tag(key), mode.lockmode(), false) };
}

fn tag(key: &str) -> pg_sys::LOCKTAG {
    let hash = key_hash(key);
    pg_sys::LOCKTAG {
        // SAFETY: MyDatabaseId is set for the whole life of a backend connected to a database.
        locktag_field1: unsafe { pg_sys::MyDatabaseId }.to_u32(),
        locktag_field2: (hash >> 32) as u32,
        locktag_field3: hash as u32,
        locktag_field4: KEY_LOCK_CLASS,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    }
}
