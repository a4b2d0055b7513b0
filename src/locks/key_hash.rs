//! Which advisory lock names a key: a 64-bit SipHash-1-3 of the key's bytes, keyed with a secret
//! that CREATE EXTENSION draws at random (table fence.lock_secret, closed to every role).
//!
//! Two keys with the same hash share their locks, so whoever holds one could hold up the other's
//! holder and waiters. With a public hash anyone could search for such a pair in seconds and aim at a
//! key they do not own; without the secret a collision can only happen by chance (about 2^-64 for a
//! given pair of keys), and even then it only serializes the two keys, never breaks fencing (the guard
//! and every statement find the lease row by the key itself).
//!
//! Every backend of a database must agree on the hash, so the secret lives in the database (and is
//! replicated with it); it is not dumped (a restored database gets a secret of its own, made with
//! its extension). A backend keeps the secret it read, with the OID of the table it read it from, and
//! reads it again when that table is not the one now in schema fence (DROP and CREATE EXTENSION).
//! While the table is missing, the public FNV-1a hash of version 0.3.0 stands in: so new and old
//! builds agree on the locks until ALTER EXTENSION UPDATE creates the secret.
use crate::pg::one_row;
use pgrx::pg_sys;
use siphasher::sip::SipHasher13;
use std::cell::Cell;
use std::hash::Hasher;

thread_local! {
    /// The secret as last read, and the OID of the table it came from.
    static SECRET: Cell<Option<(pg_sys::Oid, [u64; 2])>> = const { Cell::new(None) };
}

/// The hash that names `key`'s locks in this database.
pub fn of(key: &str) -> u64 {
    match secret() {
        Some([k0, k1]) => {
            let mut hasher = SipHasher13::new_with_keys(k0, k1);
            hasher.write(key.as_bytes());
            hasher.finish()
        }
        None => fnv1a(key),
    }
}

/// The hash that names the guard lock of `key`'s `slot` (see `keylock::guard_tag`).
pub fn of_slot(key: &str, slot: i32) -> u64 {
    let mut hasher = match secret() {
        Some([k0, k1]) => SipHasher13::new_with_keys(k0, k1),
        // Objects before 0.4.0 have no secret, and no slots either; a fixed key will do.
        None => SipHasher13::new_with_keys(fnv1a(key), 0),
    };
    hasher.write(key.as_bytes());
    hasher.write(&slot.to_le_bytes());
    hasher.finish()
}

/// The hash of pg_fence 0.3.0 and earlier, for an installation not yet updated.
fn fnv1a(key: &str) -> u64 {
    key.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The database's secret, read once per backend (and again after the table was made anew).
fn secret() -> Option<[u64; 2]> {
    let table = secret_table()?;
    match SECRET.get() {
        Some((oid, secret)) if oid == table => Some(secret),
        _ => {
            let secret = read_secret(table)?;
            SECRET.set(Some((table, secret)));
            Some(secret)
        }
    }
}

fn secret_table() -> Option<pg_sys::Oid> {
    crate::pg::installed::table(c"lock_secret")
}

/// The 16 bytes of fence.lock_secret's `secret` column.
fn read_secret(table: pg_sys::Oid) -> Option<[u64; 2]> {
    let secret = one_row::latest(table, |values, nulls| {
        // Column 2 is `secret bytea` (sql/schema.sql); column 1 is the one-row key.
        if values.len() < 2 || nulls[1] {
            return None;
        }
        // SAFETY: a bytea datum of the row, detoasted (a copy) before it is read.
        let bytes = unsafe {
            pgrx::varlena::varlena_to_byte_slice(pg_sys::pg_detoast_datum_packed(values[1].cast_mut_ptr()))
        };
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        (bytes.len() >= 16).then(|| [word(0), word(8)])
    })
    .flatten();
    if secret.is_none() {
        crate::pg::errors::state_damaged("table fence.lock_secret holds no secret");
    }
    secret
}
