//! Lease sets: lease_acquire_all grants every key of a set, or none; lease_renew_all and
//! lease_release_all keep and end them in one call. Each key of a set gets a lease of its own (its
//! own fence, guarded and fenced like any lease), and all of a set's leases share one token.
//!
//! Two sets never deadlock: each takes its keys' locks, and with `wait` their waiting rooms, in one
//! order (the keys sorted by their bytes), so no two can each hold what the other waits for. A set
//! with `wait` holds the waiting rooms of all its keys while it waits, and so is first in line for
//! each of them: a later acquire of one of its keys, with or without `wait`, comes after it (an
//! acquire without `wait` is refused while anyone waits, see `line::waiting`), and a stream of single-key
//! acquirers cannot starve it; the price is that its free keys go to nobody else meanwhile. It
//! holds no key's lock while it waits, and never queues for one (see `wait_in_the_rooms`).
use super::holder::{release_checked, renew_checked};
use super::request::new_token;
use super::request::{Lease, Request, LOCK_POLL};
use super::steps::token_holds;
use crate::leases::line::waiting;
use crate::leases::state::durability;
use crate::leases::state::kinds::Kind;
use crate::leases::state::mode::LeaseMode;
use crate::locks::keylock::{self, Mode};
use crate::locks::sweeps::{self, Tried};
use crate::pg::latch;
use crate::pg::{clock, errors, input};
use crate::stats::{self, Counter};
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::prelude::*;
use pgrx::Uuid;
use std::time::Instant;

/// Grants every key of `keys` for `ttl`, all with one token, and returns their leases (in the order
/// of the keys, sorted); or returns no row when one of them is held (with `wait`, after waiting up
/// to `wait` for all of them to be free at once).
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn lease_acquire_all(
    keys: Option<Vec<Option<String>>>,
    ttl: Option<Interval>,
    owner: default!(Option<&str>, "NULL"),
    wait: default!(Option<Interval>, "'0'"),
    session_bound: default!(Option<bool>, "false"),
    durable: default!(Option<bool>, "true"),
) -> SetOfIterator<'static, pgrx::composite_type!('static, "lease")> {
    let keys = input::key_set(keys);
    let (ttl, owner, wait) = (input::ttl(ttl), input::owner(owner), input::wait(wait));
    let session_bound = input::required(session_bound, "session_bound");
    let kind = Kind::of(input::required(durable, "durable"));
    durability::require_writable("acquire leases");
    let token = Some(new_token());
    let requests: Vec<Request> = keys
        .iter()
        .map(|key| Request::new(key, ttl, owner.clone(), session_bound, kind, token, LeaseMode::EXCLUSIVE))
        .collect();
    let wal_before = durability::wal_position();
    // As for one key: a transaction that already holds one of the keys' locks does not wait.
    let leases = if wait == 0 || keys.iter().any(|key| keylock::held_by_me(key)) {
        grant_all_unless_held(&requests, None)
    } else {
        waiting::require_read_committed();
        let deadline = clock::deadline_after(wait);
        grant_all_unless_held(&requests, Some(deadline)).or_else(|| wait_and_grant_all(&requests, deadline))
    };
    if leases.is_none() || kind == Kind::Fast {
        durability::skip_flush_if_alone(wal_before);
    }
    match &leases {
        None => stats::bump(Counter::AcquiresRefused),
        Some(granted) => {
            let counter = if kind == Kind::Durable { Counter::GrantsDurable } else { Counter::GrantsFast };
            stats::add(counter, granted.len() as u64);
        }
    }
    SetOfIterator::new(leases.unwrap_or_default())
}

/// Takes every key's lock (in order) if nobody holds or waits for any of them, and grants them all;
/// None, holding nothing, otherwise. Never waits for a holder; waits out a sweep of a key as
/// `lease_acquire` does (until `deadline` at most), holding none of the keys it took meanwhile, so
/// that it never keeps another key's holder waiting.
fn grant_all_unless_held(requests: &[Request], deadline: Option<Instant>) -> Option<Vec<Lease>> {
    let mut sweeps_waited_out = 0;
    let locked = 'tries: loop {
        let mut locked: Vec<&str> = Vec::new();
        for request in requests {
            let tried = sweeps::try_lock_for_grant(request.key, Mode::Grant);
            if let Tried::Taken = tried {
                locked.push(request.key);
                if !waiting::someone_waiting(request.key) && request.no_room_until(clock::now()).is_none() {
                    continue;
                }
            }
            locked.iter().for_each(|key| keylock::unlock(key, Mode::Grant));
            if let Tried::Swept = tried {
                if sweeps_waited_out < sweeps::WAITED_OUT && sweeps::wait_for_sweep(request.key, deadline) {
                    sweeps_waited_out += 1;
                    continue 'tries;
                }
            }
            return None;
        }
        break locked;
    };
    if !guard_locks_at_once(requests) {
        locked.iter().for_each(|key| keylock::unlock(key, Mode::Grant));
        return None;
    }
    Some(grant_locked_all(requests))
}

/// With every key's lock held: takes at once every guard lock the set's grants would wait for (of
/// a writer under an ended lease, whose transaction is still open); false, holding none of them,
/// when one is held. Such a key counts as held, as for `lease_acquire`: granting the others first
/// would leave the set to fail half way.
fn guard_locks_at_once(requests: &[Request]) -> bool {
    let mut taken = Vec::new();
    for request in requests {
        match request.take_guard_locks_at_once() {
            Some(locks) => taken.push((request.key, locks)),
            None => {
                taken.iter().for_each(|(key, locks)| keylock::unlock_guards_for_grant(key, locks));
                return false;
            }
        }
    }
    true
}

/// With every key's lock held and every key found free: grants them all. A grant that fails now
/// (only a REPEATABLE READ snapshot older than a key's row can make it) fails the whole call, so
/// that no part of the set stays granted.
fn grant_locked_all(requests: &[Request]) -> Vec<Lease> {
    let mut leases = Vec::with_capacity(requests.len());
    for (failed, request) in requests.iter().enumerate() {
        let Some(lease) = request.grant_locked(None) else {
            // The error rolls the grants back, but not the locks, which belong to the top-level
            // transaction: a caller that catches it must not keep the keys from everyone else.
            // (grant_locked gave back the lock of the key it refused.)
            let others = requests.iter().enumerate().filter(|(n, _)| *n != failed);
            others.for_each(|(_, other)| keylock::unlock(other.key, Mode::Grant));
            errors::set_changed();
        };
        leases.push(lease);
    }
    leases
}

/// Queues for every key's waiting room (in order) and, first in line for all of them, grants the set
/// as soon as every key is free; None when `deadline` comes first.
fn wait_and_grant_all(requests: &[Request], deadline: Instant) -> Option<Vec<Lease>> {
    stats::bump(Counter::WaitsBegun);
    let started = Instant::now();
    let mut entered: Vec<&str> = Vec::new();
    let mut leases = None;
    if requests.iter().all(|request| {
        let inside = waiting::enter(request.key, deadline);
        if inside {
            entered.push(request.key);
        }
        inside
    }) {
        leases = wait_in_the_rooms(requests, deadline);
    }
    entered.iter().rev().for_each(|key| waiting::leave(key));
    stats::waited(started.elapsed().as_micros() as u64, leases.is_some());
    leases
}

fn wait_in_the_rooms(requests: &[Request], deadline: Instant) -> Option<Vec<Lease>> {
    loop {
        if clock::micros_until(deadline) == 0 {
            return None;
        }
        latch::arm();
        // Holding several rooms, a set never queues for a key's lock: a transaction that holds one
        // of its keys' locks (a renewal, a guard) and then waits for another of its keys would wait
        // for this set's room while the set waited for its lock. So a key whose lock is taken (a
        // change in flight, a writer under an ended lease) is looked at again a moment later.
        let mut locked: Vec<&str> = Vec::new();
        let all_locked = requests.iter().all(|request| {
            let taken = keylock::try_lock(request.key, Mode::Grant);
            if taken {
                locked.push(request.key);
            }
            taken
        });
        let now = clock::now();
        let first_end = requests.iter().filter_map(|request| request.no_room_until(now)).min();
        // A writer under an ended lease whose transaction is still open holds the key as its lock
        // would: looked at again a moment later, as that transaction's end wakes nobody.
        let guarded = all_locked && first_end.is_none() && !guard_locks_at_once(requests);
        if all_locked && first_end.is_none() && !guarded {
            return Some(grant_locked_all(requests));
        }
        locked.iter().for_each(|key| keylock::unlock(key, Mode::Grant));
        let until_change =
            if all_locked && !guarded { first_end.map_or(LOCK_POLL, |end| end - now) } else { LOCK_POLL };
        latch::sleep(until_change.min(clock::micros_until(deadline)));
    }
}

/// Core of fence.lease_renew_all: renews every lease of the set held with `token`, and returns the
/// earliest new expiry; NULL when `token` does not hold every one of them, as last committed, or one
/// of them ends meanwhile. The SQL shell then raises PF001, which undoes any renewal made before.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn renew_all_if_held(
    keys: Option<Vec<Option<String>>>,
    token: Option<Uuid>,
    ttl: Option<Interval>,
) -> Option<TimestampWithTimeZone> {
    let keys = input::key_set(keys);
    let token = input::required(token, "token");
    let ttl = input::ttl(ttl);
    durability::require_writable("renew leases");
    let now = clock::now();
    let renewed = if keys.iter().all(|key| token_holds(key, token, now)) {
        keys.iter().map(|key| renew_checked(key, token, ttl)).collect::<Option<Vec<_>>>()
    } else {
        None
    };
    stats::add(if renewed.is_some() { Counter::Renewals } else { Counter::RenewalsLost }, keys.len() as u64);
    renewed?.into_iter().next()
}

/// Ends every lease of the set still held with `token`; returns how many this call ended (0 when
/// none was held any more). Safe to retry.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn lease_release_all(keys: Option<Vec<Option<String>>>, token: Option<Uuid>) -> i32 {
    let keys = input::key_set(keys);
    let token = input::required(token, "token");
    durability::require_writable("release leases");
    let released = keys.iter().filter(|key| release_checked(key, token)).count();
    stats::add(Counter::Releases, released as u64);
    stats::add(Counter::ReleasesStale, (keys.len() - released) as u64);
    released as i32
}
