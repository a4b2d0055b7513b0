//! Every change to a key follows the same steps, in this order:
//! 1. check the arguments (nothing is touched when they are bad);
//! 2. refuse read-only transactions and standbys;
//! 3. take the key's lock (see `locks::keylock`) only when the last committed state says the call can
//!    succeed (see `lock_key_if_it_can_succeed`), never waiting for it in an acquire without
//!    `wait`; and hold it only if something changed;
//! 4. only then read the clock, so a grant's acquired_at is never before the previous lease ended;
//! 5. run one statement that decides liveness by that clock reading and changes the row;
//! 6. settle what the commit needs (see `state::durability`): a flush for grants and renewals, none for
//!    a release or a refusal that is all its transaction wrote.
//!
use crate::leases::state::rows;
use crate::leases::state::token::token_hash;
use crate::locks::keylock::{self, Mode};
use crate::pg::clock;
use pgrx::Uuid;

/// Takes the key's lock and returns true when `can_succeed(clock now)`, a read of the last
/// committed state, says that the call can succeed; returns false, taking nothing, otherwise. So a
/// call without the live holder's token, or a revoke of a key with no live lease, never takes the
/// lock, and so holds up no acquirer, however often it is called. A call that then changes nothing
/// gives the lock back at once (`keylock::unlock`), so keeping its transaction open holds nobody
/// up either. The decisive check is always the one made under the lock.
pub fn lock_key_if_it_can_succeed(key: &str, mode: Mode, can_succeed: impl FnOnce(i64) -> bool) -> bool {
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
pub fn unseen_by_the_statement() {
    // SAFETY: reads the backend's transaction state.
    if unsafe { pgrx::pg_sys::XactIsoLevel } >= pgrx::pg_sys::XACT_REPEATABLE_READ as i32 {
        crate::pg::errors::granted_after_snapshot();
    }
}

/// Whether this token holds the key's live lease, as last committed.
pub fn token_holds(key: &str, token: Uuid, now: i64) -> bool {
    rows::held_with(key, &token_hash(token), now).is_some()
}
