//! Watching a key: fence.await_change returns the key's state (its live lease's fence and owner, or
//! vacancy) as soon as it differs from the state the caller saw last; fence.lease_proclaim changes
//! the owner a live lease advertises.
//!
//! An observer holds the key's *observer lock* (AccessShareLock, class 28778, on the key's hash)
//! while it waits, which observers share and nobody else takes: so it holds up no acquirer, holder,
//! guard or other observer. Every change of the key wakes the observers holding it once the change
//! has committed, as it wakes the head waiter (`waiting::wake_at_commit`): a grant, a proclaim, a
//! renewal, a release, a revocation, and a session-bound holder's backend as it exits. An expiry
//! needs no call: the observer sleeps until the lease it saw expires. The observers are looked up
//! after the commit, so one that arrives meanwhile reads the change committed; while nobody
//! observes, a change pays that one look at the lock table (GetLockConflicts).
use super::row::{self, Live};
use super::{durability, lock_key_if_it_can_succeed, token_hash, unseen_by_the_statement, waiting};
use crate::locks::key_hash;
use crate::locks::keylock::{self, Mode, Owner, OBSERVER_CLASS};
use crate::pg::compat;
use crate::pg::spi_plans::execute_first;
use crate::pg::{clock, input};
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::Uuid;

const OBSERVER_MODE: pg_sys::LOCKMODE = pg_sys::AccessShareLock as pg_sys::LOCKMODE;

/// An observer looks again at least this often (µs), for the changes that wake nobody (see
/// `acquire::RECHECK_AT_LEAST_EVERY`) and for the changes a standby replays.
const RECHECK_AT_LEAST_EVERY: i64 = 1_000_000;

fn observer_tag(hash: u64) -> pg_sys::LOCKTAG {
    keylock::tag(OBSERVER_CLASS, hash)
}

/// The backends (other than this one) observing the key with this hash.
pub fn observers(hash: u64) -> Vec<compat::ProcSlot> {
    waiting::room_holders(observer_tag(hash))
}

/// What an observer sees of a key: its live lease with the highest fence (the latest granted; the
/// only one, but for shared leases and semaphores), or vacancy.
struct State {
    lease: Option<Live>,
}

impl State {
    fn of(key: &str, now: i64) -> State {
        State { lease: row::live(key, now).max_by_key(|lease| lease.fence) }
    }

    fn differs_from(&self, fence: Option<i64>, owner: Option<&str>) -> bool {
        let current = match &self.lease {
            Some(lease) => (Some(lease.fence), Some(lease.owner.as_str())),
            None => (None, None),
        };
        current != (fence, owner)
    }
}

/// The key's state (its live lease's fence and owner, or every column NULL but `live`, false, when
/// no lease is live) as soon as it differs from (`seen_fence`, `seen_owner`), or when `timeout`
/// runs out, unchanged. Reads the latest committed state, at any isolation level.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
#[allow(clippy::type_complexity)] // pg_extern needs the row type spelled out, not an alias
fn await_change(
    key: Option<&str>,
    seen_fence: Option<i64>,
    seen_owner: Option<&str>,
    timeout: Option<Interval>,
) -> TableIterator<
    'static,
    (
        name!(fence, Option<i64>),
        name!(owner, Option<String>),
        name!(live, bool),
        name!(acquired_at, Option<TimestampWithTimeZone>),
        name!(expires_at, Option<TimestampWithTimeZone>),
    ),
> {
    let key = input::key(key);
    let deadline = clock::deadline_after(input::timeout(timeout));
    let tag = observer_tag(key_hash::of(key));
    keylock::acquire(&tag, OBSERVER_MODE, Owner::Subtransaction, false);
    let state = loop {
        waiting::arm();
        let now = clock::now();
        let state = State::of(key, now);
        let left = clock::micros_until(deadline);
        if state.differs_from(seen_fence, seen_owner) || left == 0 {
            break state;
        }
        let until_expiry = state.lease.as_ref().map_or(i64::MAX, |lease| lease.expires_at - now);
        waiting::sleep(left.min(until_expiry).clamp(1, RECHECK_AT_LEAST_EVERY));
    };
    keylock::release(&tag, OBSERVER_MODE, Owner::Subtransaction);
    let row = match state.lease {
        Some(lease) => (
            Some(lease.fence),
            Some(lease.owner),
            true,
            Some(clock::timestamp(lease.acquired_at)),
            Some(clock::timestamp(lease.expires_at)),
        ),
        None => (None, None, false, None, None),
    };
    TableIterator::once(row)
}

/// Changes the owner the live lease held with this hash advertises; returns its fence.
macro_rules! proclaim {
    ($table:literal) => {
        concat!(
            "UPDATE ",
            $table,
            " SET owner = $3 WHERE key = $1 AND token_hash = $2 AND ",
            live_at!("$4"),
            " RETURNING fence"
        )
    };
}

/// Sets the `owner` of the live lease that `token` holds (the leader's advertised value: its
/// address, its version), keeping its fence and expiry: true, or false when that token no longer
/// holds a live lease of the key. Observers see the change.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn lease_proclaim(key: Option<&str>, token: Option<Uuid>, owner: Option<&str>) -> bool {
    let key = input::key(key);
    let token = input::required(token, "token");
    let owner = input::owner(Some(input::required(owner, "owner")));
    durability::require_writable("proclaim a lease's owner");
    let wal_before = durability::wal_position();
    let hash = token_hash(token);
    let holds = |now| row::held_with(key, &hash, now).is_some();
    if !lock_key_if_it_can_succeed(key, Mode::Change, holds) {
        return false;
    }
    let now = clock::now();
    let Some(held) = row::held_with(key, &hash, now) else {
        keylock::unlock(key, Mode::Change);
        return false;
    };
    let proclaimed = if held.kind == super::kinds::Kind::Fast && super::memory::changes::in_use() {
        super::memory::changes::proclaim(key, &hash, &owner, now)
    } else {
        let args = [key.into(), hash.into(), owner.as_str().into(), clock::timestamp(now).into()];
        execute_first::<i64>(by_kind!(held.kind, proclaim), &args)
    };
    if proclaimed.is_none() {
        unseen_by_the_statement();
        keylock::unlock(key, Mode::Change);
        return false;
    }
    match held.kind {
        super::kinds::Kind::Durable => durability::require_durable_commit(),
        super::kinds::Kind::Fast => durability::skip_flush_if_alone(wal_before),
    }
    waiting::wake_at_commit(key);
    true
}
