//! Watching a key: fence.await_change returns the key's state (its live lease's fence and owner, or
//! vacancy) as soon as it differs from the state the caller saw last (fence.lease_proclaim, which
//! changes the owner a live lease advertises, is such a change: see `proclaim`).
//!
//! An observer holds the key's *observer lock* (AccessShareLock, class 28778, on the key's hash)
//! while it waits, which observers share and nobody else takes: so it holds up no acquirer, holder,
//! guard or other observer. Every change of the key wakes the observers holding it once the change
//! has committed, as it wakes the head waiter (`wakeups::wake_at_commit`): a grant, a proclaim, a
//! renewal, a release, a revocation, and a session-bound holder's backend as it exits. An expiry
//! needs no call: the observer sleeps until the lease it saw expires. The observers are looked up
//! after the commit, so one that arrives meanwhile reads the change committed; while nobody
//! observes, a change pays that one look at the lock table (GetLockConflicts).
//!
//! An observer is paced: a session looks at a key no sooner than `pg_fence.observe_interval` after
//! its last answer that told a change of that key, sleeping meanwhile without its observer lock,
//! where no change wakes it. A key that changes faster than that is seen at that pace, its latest state each time; its
//! holders then pay for at most one wake-up and one look per observer and interval, not for one per
//! change (without the pace, 100 observers slowed a hot key's acquire+release pairs 17x on 2 cores).
use crate::leases::line::wakeups;
use crate::leases::state::found::Live;
use crate::leases::state::rows;
use crate::locks::key_hash;
use crate::pg::{clock, input, latch};
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::RefCell;
use std::time::Instant;

/// An observer looks again at least this often (µs), for the changes that wake nobody (see
/// `request::RECHECK_AT_LEAST_EVERY`) and for the changes a standby replays.
const RECHECK_AT_LEAST_EVERY: i64 = 1_000_000;

thread_local! {
    /// When this session's await_change last told a change of each key (by hash), for the keys
    /// told within the last interval: a session that watches many keys keeps a few entries.
    static LAST_TOLD: RefCell<Vec<(u64, Instant)>> = const { RefCell::new(Vec::new()) };
}

/// What an observer sees of a key: its live lease with the highest fence (the latest granted; the
/// only one, but for shared leases and semaphores), or vacancy.
struct State {
    lease: Option<Live>,
}

impl State {
    fn of(key: &str, now: i64) -> State {
        State { lease: rows::live(key, now).max_by_key(|lease| lease.fence) }
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
    // The hash reads fence.lock_secret (once per backend): that lock, too, is not kept.
    let hash = crate::pg::subtransaction::without_keeping_locks(|| key_hash::of(key), still_installed);
    wait_for_the_pace(hash, deadline);
    wakeups::observe(hash);
    let state = loop {
        latch::arm();
        let now = clock::now();
        // Looked at without keeping the tables locked while this call sleeps (see `subtransaction`).
        // No lock keeps DROP EXTENSION from ending pg_fence meanwhile: then this call says so.
        still_installed();
        let state = crate::pg::subtransaction::without_keeping_locks(|| State::of(key, now), still_installed);
        let left = clock::micros_until(deadline);
        if state.differs_from(seen_fence, seen_owner) || left == 0 {
            break state;
        }
        let until_expiry = state.lease.as_ref().map_or(i64::MAX, |lease| lease.expires_at - now);
        latch::sleep(left.min(until_expiry).clamp(1, RECHECK_AT_LEAST_EVERY));
    };
    wakeups::stop_observing(hash);
    if state.differs_from(seen_fence, seen_owner) {
        told_now(hash);
    }
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

/// Sleeps, without the observer lock and deaf to wake-ups, until `pg_fence.observe_interval` has
/// passed since this session's last answer that told a change of the key (or until `deadline`).
fn wait_for_the_pace(hash: u64, deadline: Instant) {
    let told = LAST_TOLD.with_borrow(|told| told.iter().find(|(each, _)| *each == hash).map(|(_, at)| *at));
    let Some(told) = told else { return };
    let until = (told + crate::pg::settings::observe_interval()).min(deadline);
    let left = until.saturating_duration_since(Instant::now());
    if !left.is_zero() {
        latch::pause(left.as_micros() as i64);
    }
}

fn told_now(hash: u64) {
    let (now, interval) = (Instant::now(), crate::pg::settings::observe_interval());
    LAST_TOLD.with_borrow_mut(|told| {
        told.retain(|(each, at)| *each != hash && now.duration_since(*at) < interval);
        told.push((hash, now));
    });
}

/// Raises an error if pg_fence's tables are gone (DROP EXTENSION while a call waited), as the
/// catalog changes other backends committed say.
fn still_installed() {
    // SAFETY: reads those changes, as each statement does at its start.
    unsafe { pg_sys::AcceptInvalidationMessages() };
    if crate::pg::installed::table(c"lease_state").is_none() {
        crate::pg::errors::dropped_while_waiting();
    }
}
