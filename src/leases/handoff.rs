//! Hand-off (lease_handoff): the holder ends its lease and the key goes at once, with a higher fence,
//! to a waiting acquirer named by its owner, ahead of the queue: client-go's preferred holder, for a
//! rolling update.
//!
//! - A waiting acquire stands as a *candidate* while it waits: it holds the candidate lock (class
//!   28779, AccessShareLock) on a keyed hash of its key and owner, which candidates of one owner
//!   share and nobody else takes. lease_handoff finds a candidate by that lock (the lock table, not
//!   a table: a waiter commits nothing while it waits).
//! - lease_handoff releases the caller's lease and grants the key, in the same transaction under
//!   the key lock, to a token nobody knows, with `handed_to` set to the candidate's owner. So the
//!   key has its new fence and owner at once, and nobody can renew, release or write under that
//!   lease until the candidate claims it.
//! - The candidate claims it when it next looks at the key as the head of the key's waiting room:
//!   it puts its own token's hash, session and expiry in the row, keeping the fence. A head that is
//!   not the candidate steps back to the end of the queue while such a lease waits for its
//!   candidate, so that the candidate gets to the head; the others keep their order among
//!   themselves. A candidate that gives up before claiming leaves the lease to expire, unused.
use super::acquire::{Lease, Request};
use super::kinds::Kind;
use super::{durability, lock_key_if_it_can_succeed, row, sessions, token_hash, waiting};
use crate::locks::key_hash;
use crate::locks::keylock::{self, Mode, Owner, CANDIDATE_CLASS};
use crate::pg::spi_plans::execute_first;
use crate::pg::{clock, errors, input};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::Uuid;
use std::time::{Duration, Instant};

const CANDIDATE_MODE: pg_sys::LOCKMODE = pg_sys::AccessShareLock as pg_sys::LOCKMODE;

/// How long a hand-off waits for the old holder's writes in other transactions to end.
const WRITERS_WAIT: Duration = Duration::from_secs(5);

/// The longest a handed-off lease waits for its candidate to claim it (µs): a candidate that gave
/// up in the meantime leaves the key free soon, not after the old lease's whole TTL.
const CLAIM_WITHIN: i64 = 10_000_000;

fn candidate_tag(key: &str, owner: &str) -> pg_sys::LOCKTAG {
    keylock::tag(CANDIDATE_CLASS, key_hash::of(&format!("{key}\u{1}{owner}")))
}

/// Stands as a candidate for `key` under `owner` while this call waits for it.
pub(super) fn stand(key: &str, owner: &str) {
    keylock::acquire(&candidate_tag(key, owner), CANDIDATE_MODE, Owner::Subtransaction, false);
}

pub(super) fn step_down(key: &str, owner: &str) {
    keylock::release(&candidate_tag(key, owner), CANDIDATE_MODE, Owner::Subtransaction);
}

/// Whether another session waits for `key` under `owner`.
fn candidate_waits(key: &str, owner: &str) -> bool {
    !waiting::room_holders(candidate_tag(key, owner)).is_empty()
}

/// Takes over the lease handed off to this request's owner: its token, session and expiry, with
/// the fence the hand-off granted. None when no such lease is live.
macro_rules! claim {
    ($table:literal) => {
        concat!(
            "UPDATE ",
            $table,
            " SET token_hash = $3, handed_to = NULL, expires_at = $5, session_pid = $6, session_id = $7,
                  lock_delay = $8
              WHERE key = $1 AND handed_to = $2 AND ",
            live_at!("$4"),
            " RETURNING ROW(key, owner, fence, $9, acquired_at, expires_at)::fence.lease"
        )
    };
}

/// The lease handed off to `request`'s owner, claimed, if there is one.
pub(super) fn claim(request: &Request) -> Option<Lease> {
    let handed =
        |now| row::live(request.key, now).any(|live| live.handed_to.as_deref() == Some(&request.owner));
    if !lock_key_if_it_can_succeed(request.key, Mode::Change, handed) {
        return None;
    }
    let now = clock::now();
    let Some(live) =
        row::live(request.key, now).find(|live| live.handed_to.as_deref() == Some(&request.owner))
    else {
        keylock::unlock(request.key, Mode::Change);
        return None;
    };
    let token = request.token.unwrap_or_else(|| Uuid::from_bytes(*uuid::Uuid::new_v4().as_bytes()));
    let session = request.session_bound.then(sessions::hold_session_lock);
    let args = [
        request.key.into(),
        request.owner.as_str().into(),
        token_hash(token).into(),
        clock::timestamp(now).into(),
        clock::timestamp(now + request.ttl).into(),
        session.map(|(pid, _)| pid).into(),
        session.map(|(_, id)| id).into(),
        request.lock_delay.into(),
        token.into(),
    ];
    let Some(lease) = execute_first::<Lease>(by_kind!(live.kind, claim), &args) else {
        keylock::unlock(request.key, Mode::Change);
        return None;
    };
    if request.session_bound {
        sessions::bound(request.key);
    }
    if live.kind == Kind::Durable {
        durability::require_durable_commit();
    }
    Some(lease)
}

/// Whether the head of the key's waiting room, which `request` is, should step back to the end of
/// the queue: a live lease waits to be claimed by another owner's candidate, who waits behind it.
pub(super) fn let_candidate_pass(request: &Request) -> bool {
    row::live(request.key, clock::now()).any(|live| {
        live.handed_to
            .as_ref()
            .is_some_and(|owner| *owner != request.owner && candidate_waits(request.key, owner))
    })
}

/// Ends the lease `token` holds and grants the key, with a higher fence, to the waiting acquirer
/// whose owner is `to_owner`, ahead of the queue; returns the new lease without its token, which only
/// that acquirer learns. NULL, changing nothing, when no acquirer of that owner waits for the key or
/// `token` does not hold it.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn lease_handoff(
    key: Option<&str>,
    token: Option<Uuid>,
    to_owner: Option<&str>,
) -> Option<pgrx::composite_type!('static, "lease")> {
    let key = input::key(key);
    let token = input::required(token, "token");
    let to_owner = input::required(to_owner, "to_owner");
    if to_owner.is_empty() {
        errors::invalid_argument(
            "to_owner must not be empty".into(),
            "Pass the owner a waiting acquirer of the key gave lease_acquire.",
        );
    }
    let to_owner = input::owner(Some(to_owner));
    durability::require_writable("hand off a lease");
    if !candidate_waits(key, &to_owner) {
        return None;
    }
    let hash = token_hash(token);
    let held = row::held_with(key, &hash, clock::now())?;
    let mut request = Request::new(key, 0, to_owner, false, held.kind, None, held.mode);
    // As a grant, it waits for writers under the old fence in other transactions: up to a bound.
    let deadline = Instant::now() + WRITERS_WAIT;
    if !keylock::lock_until(key, request.key_lock(), deadline) {
        errors::handoff_blocked(key);
    }
    let now = clock::now();
    let Some(held) = row::held_with(key, &hash, now) else {
        keylock::unlock(key, request.key_lock());
        return None;
    };
    super::holder::end_held(key, &hash, &held, now);
    // Until claimed, no longer than the old lease was granted for, nor than CLAIM_WITHIN.
    request.ttl = (held.expires_at - held.acquired_at).min(CLAIM_WITHIN);
    request.handed_to = Some(request.owner.clone());
    let Some(mut lease) = request.grant_locked(Some(deadline)) else {
        errors::handoff_blocked(key);
    };
    lease.set_by_name::<Option<Uuid>>("token", None).ok()?;
    Some(lease)
}
