//! The advisory locks pg_fence takes, and only those: the per-key lock that serializes every change
//! to one key and orders a grant after the writes under the fence before it (`keylock`), the other
//! classes it shares one lock space with (waiting room, session locks), the marks of sweeps that
//! grants wait out (`sweeps`), and the secret-keyed hash
//! that names a key's locks (`key_hash`), so that no role can aim a lock at another role's key.
//!
//! Depends on pg/ only; leases/ and writes/ take these locks.
pub mod key_hash;
pub mod keylock;
pub mod sweeps;
