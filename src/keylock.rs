//! The per-key lock. Every change to a key (grant, renew, release) first takes this lock in
//! exclusive mode and keeps it until its transaction ends, so changes to one key happen one at a time
//! and each sees the previous one committed. It is an ordinary PostgreSQL advisory lock: waits obey
//! lock_timeout, statement_timeout and query cancel, and take part in deadlock detection.
use pgrx::pg_sys;

/// Shows as `objsubid` of pg_fence's rows in pg_locks (locktype 'advisory'). pg_advisory_lock(bigint)
/// uses 1 and pg_advisory_lock(int, int) uses 2, so an application's own advisory locks never
/// collide with pg_fence's.
pub const KEY_LOCK_CLASS: u16 = 0x7066;

/// 64-bit FNV-1a of the key. Fixed forever: backends running two builds of pg_fence side by side
/// (during an upgrade) must still agree on which lock guards a key.
pub fn key_hash(key: &str) -> u64 {
    key.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Waits for and takes the key's lock until the end of the current transaction.
pub fn lock_for_change(key: &str) {
    let hash = key_hash(key);
    let tag = pg_sys::LOCKTAG {
        // SAFETY: MyDatabaseId is set for the whole life of a backend connected to a database.
        locktag_field1: unsafe { pg_sys::MyDatabaseId }.to_u32(),
        locktag_field2: (hash >> 32) as u32,
        locktag_field3: hash as u32,
        locktag_field4: KEY_LOCK_CLASS,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    };
    // SAFETY: the same call pg_advisory_xact_lock() makes; errors (cancel, timeout, deadlock) are
    // raised by PostgreSQL and turned into Rust panics by pgrx's FFI guard.
    unsafe {
        pg_sys::LockAcquire(&tag, pg_sys::ExclusiveLock as pg_sys::LOCKMODE, false, false);
    }
}
