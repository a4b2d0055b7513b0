//! Leases: who holds a key, until when, under which fence. The API (`acquire`, `holder`,
//! current_fence here, `revoke`), and what a lease is made of: its row and kinds, its fence, its
//! liveness, its commit's durability, waiting for it, and session-bound leases.
//!
//! Every change to a key follows the same steps, in this order:
//! 1. check the arguments (nothing is touched when they are bad);
//! 2. refuse read-only transactions and standbys;
//! 3. take the key's lock (see `keylock`) only when the last committed state says the call can
//!    succeed (see `lock_key_if_it_can_succeed`), never waiting for it in an acquire without
//!    `wait`; and hold it only if something changed;
//! 4. only then read the clock, so a grant's acquired_at is never before the previous lease ended;
//! 5. run one statement that decides liveness by that clock reading and changes the row;
//! 6. settle what the commit needs (see `durability`): a flush for grants and renewals, none for
//!    a release or a refusal that is all its transaction wrote.
//!
//! Tokens are stored only as their SHA-256: a token is shown once, to the caller of lease_acquire,
//! and not even a superuser reading the table (or a backup of it) can use it afterwards.
//!
//! What may depend on what: leases/ uses locks/, pg/ and stats; writes/ read a lease (its row and
//! liveness) but never change one; sweeper/ tidies the rows of leases that have already ended.
#[macro_use]
mod liveness;
#[macro_use]
pub mod kinds;
#[macro_use]
pub mod ended;
pub mod modes;

mod acquire;
pub mod durability;
pub mod fences;
pub mod handoff;
pub mod holder;
pub mod memory;
pub mod next_in_line;
pub mod notify;
pub mod observe;
pub mod revoke;
pub mod row;
pub mod sessions;
pub mod sets;
pub mod waiting;

use self::kinds::Kind;
use crate::locks::keylock::{self, Mode};
use crate::pg::clock;
use crate::pg::input;
use crate::pg::spi_plans::execute_first;
use pgrx::prelude::*;
use pgrx::Uuid;

/// The key's last fence: of its durable rows, or of both kinds' where fast leases can be read (see
/// `Kind::table`).
const CURRENT_FENCE: &str = "SELECT max(fence) FROM fence.lease_state WHERE key = $1";
const CURRENT_FENCE_OF_BOTH: &str = "SELECT greatest((SELECT max(fence) FROM fence.lease_state WHERE key = $1),
                                                 (SELECT max(fence) FROM fence.fast_lease_state WHERE key = $1))";

/// The last fence granted for `key`; NULL if it was never granted, or its lease ended more than
/// pg_fence.retain_ended ago and the sweep has deleted its row.
#[pg_extern(stable, parallel_safe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn current_fence(key: Option<&str>) -> Option<i64> {
    let key = input::key(key);
    if memory::changes::in_use() {
        let in_table = execute_first::<i64>(CURRENT_FENCE, &[key.into()]);
        return in_table.max(memory::changes::last_fence(key));
    }
    let statement = if Kind::Fast.table().is_some() { CURRENT_FENCE_OF_BOTH } else { CURRENT_FENCE };
    execute_first::<i64>(statement, &[key.into()])
}

/// Takes the key's lock and returns true when `can_succeed(clock now)`, a read of the last
/// committed state, says that the call can succeed; returns false, taking nothing, otherwise. So a
/// call without the live holder's token, or a revoke of a key with no live lease, never takes the
/// lock, and so holds up no acquirer, however often it is called. A call that then changes nothing
/// gives the lock back at once (`keylock::unlock`), so keeping its transaction open holds nobody
/// up either. The decisive check is always the one made under the lock.
fn lock_key_if_it_can_succeed(key: &str, mode: Mode, can_succeed: impl FnOnce(i64) -> bool) -> bool {
    if !can_succeed(clock::now()) {
        return false;
    }
    keylock::lock(key, mode);
    true
}

/// A lease found live as last committed, under the key's lock, that the statement changing it did
/// not find. Under REPEATABLE READ or SERIALIZABLE the transaction's snapshot predates its grant:
/// 40001 (retry), never "lost". Under READ COMMITTED the sweep, which takes no key lock, ended it
/// between the look and the statement as it expired: the caller answers "lost".
fn unseen_by_the_statement() {
    // SAFETY: reads the backend's transaction state.
    if unsafe { pgrx::pg_sys::XactIsoLevel } >= pgrx::pg_sys::XACT_REPEATABLE_READ as i32 {
        crate::pg::errors::granted_after_snapshot();
    }
}

/// Whether this token holds the key's live lease, as last committed.
fn token_holds(key: &str, token: Uuid, now: i64) -> bool {
    row::held_with(key, &token_hash(token), now).is_some()
}

/// What the table keeps of a token: SHA-256 of its 16 bytes, the same value as SQL's
/// `sha256(uuid_send(token))`. Hashed here rather than in the statements because PostgreSQL's
/// sha256() sets up an OpenSSL digest context on every call, which costs more CPU than the hash
/// itself, on every acquire and release (docs/benchmarks.md).
fn token_hash(token: Uuid) -> Vec<u8> {
    token_hash_array(token).to_vec()
}

fn token_hash_array(token: Uuid) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(token.as_bytes()).into()
}
