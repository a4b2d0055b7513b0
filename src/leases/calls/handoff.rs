//! Hand-off (lease_handoff): the holder ends its lease and the key goes at once, with a higher fence,
//! to a waiting acquirer named by its owner, ahead of the queue: client-go's preferred holder, for a
//! rolling update.
//!
//! - A waiting acquire stands as a *candidate* while it waits: it holds the candidate lock (class
//!   28779, AccessShareLock) on a keyed hash of its key, owner, mode and kind, which candidates
//!   alike share and nobody else takes. lease_handoff finds a candidate for a lease like its own by
//!   that lock (the lock table, not a table: a waiter commits nothing while it waits). So a waiter
//!   is handed only a lease of the mode and kind it asked for.
//! - lease_handoff releases the caller's lease and grants the key, in the same transaction under
//!   the key lock, to a token nobody knows, with `handed_to` set to the candidate's owner, for the
//!   rest of the old lease's TTL and CLAIM_WITHIN at most. So the key has its new fence and owner at
//!   once, and nobody can renew or release that lease until the candidate claims it.
//! - The candidate claims it when it next looks at the key as the head of the key's waiting room:
//!   it puts its own token's hash, session and expiry in the row, keeping the fence. A head that is
//!   not the candidate steps back to the end of the queue while such a lease waits for its
//!   candidate, so that the candidate gets to the head; the others keep their order among
//!   themselves. A candidate that gives up before claiming leaves the lease to expire, unused. (A
//!   lease set first in line for the key does not step back: see `sets`.)
use super::holder::end_held;
use super::request::{lease_value, new_token, Lease, Request};
use super::steps::lock_key_if_it_can_succeed;
use crate::leases::line::notify::{self, Event};
use crate::leases::line::sessions;
use crate::leases::line::wakeups;
use crate::leases::state::found::Live;
use crate::leases::state::kinds::Kind;
use crate::leases::state::mode::LeaseMode;
use crate::leases::state::token::{token_hash, token_hash_array};
use crate::leases::state::{durability, memory, rows};
use crate::locks::key_hash;
use crate::locks::keylock::{self, Mode, Owner, CANDIDATE_CLASS};
use crate::pg::spi_plans::execute_first;
use crate::pg::{clock, errors, input};
use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReportable;
use pgrx::prelude::*;
use pgrx::Uuid;
use std::time::{Duration, Instant};

const CANDIDATE_MODE: pg_sys::LOCKMODE = pg_sys::AccessShareLock as pg_sys::LOCKMODE;

/// How long a hand-off waits for the old holder's writes in other transactions to end.
const WRITERS_WAIT: Duration = Duration::from_secs(5);

/// The longest a handed-off lease waits for its candidate to claim it (µs): a candidate that gave
/// up in the meantime leaves the key free soon, not after the old lease's whole TTL.
const CLAIM_WITHIN: i64 = 10_000_000;

/// The candidate lock of waiters of `key` under `owner` for a lease of `mode` and `kind`. The parts
/// are length-prefixed, so that no two different ones hash the same text.
fn candidate_tag(key: &str, owner: &str, mode: LeaseMode, kind: Kind) -> pg_sys::LOCKTAG {
    let mode = if mode.shared { -1 } else { mode.permits };
    let text = format!("{}:{key}{}:{owner}{mode}:{}", key.len(), owner.len(), kind as u8);
    keylock::tag(CANDIDATE_CLASS, key_hash::of(&text))
}

fn tag_of(request: &Request) -> pg_sys::LOCKTAG {
    candidate_tag(request.key, &request.owner, request.mode, request.kind)
}

/// Stands as a candidate for the lease `request` asks for, while it waits.
pub(super) fn stand(request: &Request) {
    keylock::acquire(&tag_of(request), CANDIDATE_MODE, Owner::Subtransaction, false);
}

pub(super) fn step_down(request: &Request) {
    keylock::release(&tag_of(request), CANDIDATE_MODE, Owner::Subtransaction);
}

/// Whether another session waits for `key` under `owner` for a lease like `lease`.
fn candidate_waits(key: &str, owner: &str, lease: &Live) -> bool {
    !wakeups::room_holders(candidate_tag(key, owner, lease.mode, lease.kind)).is_empty()
}

/// Whether `live` is handed off to a lease like the one `request` asks for.
fn handed_to(live: &Live, request: &Request) -> bool {
    live.handed_to.as_deref() == Some(request.owner.as_str())
        && live.mode == request.mode
        && live.kind == request.kind
}

/// Takes over the lease in slot $10 handed off to this request's owner: its token, session and
/// expiry, with the fence the hand-off granted. None when it is no longer live.
macro_rules! claim {
    ($table:literal) => {
        concat!(
            "UPDATE ",
            $table,
            " SET token_hash = $3, handed_to = NULL, expires_at = $5, session_pid = $6, session_id = $7,
                  lock_delay = $8
              WHERE key = $1 AND slot = $10 AND handed_to = $2 AND ",
            live_at!("$4"),
            " RETURNING ROW(key, owner, fence, $9, acquired_at, expires_at)::fence.lease"
        )
    };
}

/// The lease handed off to `request`, claimed, if there is one.
pub(super) fn claim(request: &Request) -> Option<Lease> {
    let handed = |now| rows::live(request.key, now).any(|live| handed_to(&live, request));
    if !lock_key_if_it_can_succeed(request.key, Mode::Change, handed) {
        return None;
    }
    let now = clock::now();
    let Some(live) = rows::live(request.key, now).find(|live| handed_to(live, request)) else {
        keylock::unlock(request.key, Mode::Change);
        return None;
    };
    let token = request.token.unwrap_or_else(new_token);
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
        live.slot.into(),
    ];
    let claimed = if live.kind == Kind::Fast && memory::changes::in_use() {
        let claim = memory::changes::Claim {
            slot: live.slot,
            handed_to: &request.owner,
            token_hash: token_hash_array(token),
            expires_at: now + request.ttl,
            session,
            lock_delay: request.lock_delay,
        };
        memory::changes::claim(request.key, &claim, now).map(|(owner, fence, acquired_at, expires_at)| {
            lease_value(request.key, &owner, fence, token, acquired_at, expires_at)
        })
    } else {
        execute_first::<Lease>(by_kind!(live.kind, claim), &args)
    };
    let Some(lease) = claimed else {
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
/// the queue: a live lease waits to be claimed by another candidate, who waits behind it.
pub(super) fn let_candidate_pass(request: &Request) -> bool {
    rows::live(request.key, clock::now()).any(|live| {
        let waits = |owner: &String| candidate_waits(request.key, owner, &live);
        !handed_to(&live, request) && live.handed_to.as_ref().is_some_and(waits)
    })
}

/// Ends the lease `token` holds and grants the key, with a higher fence, to the waiting acquirer
/// whose owner is `to_owner` and that asked for a lease of the same mode and kind, ahead of the
/// queue; returns the new lease without its token, which only that acquirer learns. NULL, changing
/// nothing, when no such acquirer waits for the key, `token` does not hold it, or a lock-delay holds
/// the key back.
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
    let hash = token_hash(token);
    let held = rows::held_with(key, &hash, clock::now())?;
    if !candidate_waits(key, &to_owner, &held) {
        return None;
    }
    let mut request = Request::new(key, 0, to_owner, false, held.kind, None, held.mode);
    // As a grant, it waits for writers under the old fence in other transactions: up to a bound.
    let deadline = Instant::now() + WRITERS_WAIT;
    if !keylock::lock_until(key, request.key_lock(), deadline) {
        errors::handoff_blocked(key);
    }
    // Decided again under the lock: the candidate may have given up, or been granted the key.
    let now = clock::now();
    let rows = rows::all(key, now);
    let held = rows.iter().filter_map(|found| found.live.as_ref()).find(|live| live.token_hash == hash);
    let Some(held) = held.filter(|held| candidate_waits(key, &request.owner, held)) else {
        keylock::unlock(key, request.key_lock());
        return None;
    };
    if request.held_back_until(&rows, now).is_some() {
        keylock::unlock(key, request.key_lock());
        return None;
    }
    let Some(old_fence) = end_held(key, &hash, held, now) else {
        keylock::unlock(key, request.key_lock());
        return None;
    };
    // Until claimed: the rest of the old lease's TTL, CLAIM_WITHIN at most.
    request.ttl = (held.expires_at - now).min(CLAIM_WITHIN);
    request.handed_to = Some(request.owner.clone());
    let Some(mut lease) = request.grant_locked(Some(deadline)) else {
        errors::handoff_blocked(key);
    };
    sessions::unbound(key);
    notify::send(Event::Released, key, old_fence);
    lease.set_by_name::<Option<Uuid>>("token", None).unwrap_or_report();
    Some(lease)
}
