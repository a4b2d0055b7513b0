//! lease_acquire: grants a key whose lease, of either kind, is dead, with a fence above every fence
//! the key had (see `state::fences`); waits for the key when asked (see `line::waiting`), where a
//! hand-off may name it (see `handoff`); and answers a retry that brings the token of the lease it
//! granted with that same lease. The grant itself: `grant`.
use super::handoff;
use super::request::{lease_value, Lease, Request, LOCK_POLL};
use crate::leases::line::{sessions, waiting};
use crate::leases::state::kinds::Kind;
use crate::leases::state::mode::LeaseMode;
use crate::leases::state::{durability, rows, token::token_hash};
use crate::locks::keylock::{self, Mode};
use crate::locks::sweeps;
use crate::pg::{clock, input, latch};
use crate::stats::{self, Counter};
use pgrx::datum::Interval;
use pgrx::prelude::*;
use pgrx::Uuid;
use std::time::Instant;

/// Grants the key for `ttl` and returns the lease. When the live leases of the key leave no room
/// for it (see `state::slots`): NULL at once, or with `wait`, after waiting up to `wait` for room (NULL if
/// none came). A `session_bound` lease also ends when this session ends; a lease that is not
/// `durable` lives in unlogged state (see `state::kinds`); a `shared` one beside other shared ones, and
/// one of `permits` beside fewer than that many.
#[pg_extern(name = "lease_acquire", volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
#[allow(clippy::too_many_arguments)]
fn acquire_in_mode(
    key: Option<&str>,
    ttl: Option<Interval>,
    owner: default!(Option<&str>, "NULL"),
    wait: default!(Option<Interval>, "'0'"),
    session_bound: default!(Option<bool>, "false"),
    durable: default!(Option<bool>, "true"),
    token: default!(Option<Uuid>, "NULL"),
    shared: default!(Option<bool>, "false"),
    permits: default!(Option<i32>, "1"),
    lock_delay: default!(Option<Interval>, "'0'"),
) -> Option<pgrx::composite_type!('static, "lease")> {
    let (key, ttl, owner) = (input::key(key), input::ttl(ttl), input::owner(owner));
    let wait = input::wait(wait);
    let session_bound = input::required(session_bound, "session_bound");
    let kind = Kind::of(input::required(durable, "durable"));
    let token = token.map(input::token);
    let mode = LeaseMode::of(input::required(shared, "shared"), input::required(permits, "permits"));
    let lock_delay = input::lock_delay(lock_delay);
    durability::require_writable("acquire a lease");
    // A retry of an acquire whose reply was lost: the lease it granted, as it was granted.
    let wal_before = durability::wal_position();
    if let Some(lease) = token.and_then(|token| lease_held_with(key, token, None)) {
        durability::skip_flush_if_alone(wal_before);
        return Some(lease);
    }
    let mut request = Request::new(key, ttl, owner, session_bound, kind, token, mode);
    request.lock_delay = lock_delay;
    let lease = request.acquire(wait);
    stats::bump(match (&lease, kind) {
        (None, _) => Counter::AcquiresRefused,
        (Some(_), Kind::Durable) => Counter::GrantsDurable,
        (Some(_), Kind::Fast) => Counter::GrantsFast,
    });
    lease
}

/// The key's live lease, as last committed, if `token` holds it: (key, owner, fence, token,
/// acquired_at, expires_at), unchanged. With `kind`, among the key's leases of that kind only (see
/// `rows::held_with_of_kind`).
pub(super) fn lease_held_with(key: &str, token: Uuid, kind: Option<Kind>) -> Option<Lease> {
    let (hash, now) = (token_hash(token), clock::now());
    let held = match kind {
        Some(kind) => rows::held_with_of_kind(kind, key, &hash, now),
        None => rows::held_with(key, &hash, now),
    }?;
    Some(lease_value(key, &held.owner, held.fence, token, held.acquired_at, held.expires_at))
}

/// lease_acquire as the SQL objects of version 0.4.0 declare it, without `shared` and `permits`.
#[pg_extern(sql = false)]
fn acquire(
    key: Option<&str>,
    ttl: Option<Interval>,
    owner: Option<&str>,
    wait: Option<Interval>,
    session_bound: Option<bool>,
    durable: Option<bool>,
    token: Option<Uuid>,
) -> Option<pgrx::composite_type!('static, "lease")> {
    let no_delay = Interval::new(0, 0, 0).ok();
    acquire_in_mode(key, ttl, owner, wait, session_bound, durable, token, Some(false), Some(1), no_delay)
}

/// lease_acquire as the SQL objects of versions before 0.4.0 declare it, without `durable`.
#[pg_extern(sql = false)]
fn lease_acquire(
    key: Option<&str>,
    ttl: Option<Interval>,
    owner: Option<&str>,
    wait: Option<Interval>,
    session_bound: Option<bool>,
) -> Option<pgrx::composite_type!('static, "lease")> {
    acquire(key, ttl, owner, wait, session_bound, Some(true), None)
}

impl Request<'_> {
    fn acquire(&self, wait: i64) -> Option<Lease> {
        if wait > 0 {
            waiting::require_read_committed();
        }
        let wal_before = durability::wal_position();
        // A transaction that already holds the key's lock (it changed or guarded the key) would wait
        // for itself, or deadlock with the waiter it queues behind: it does not wait.
        // A free key is granted at once; only an acquire that finds it held begins to wait.
        let lease = if wait == 0 || keylock::held_by_me(self.key) {
            self.grant_unless_held(None)
        } else {
            let deadline = clock::deadline_after(wait);
            self.grant_unless_held(Some(deadline)).or_else(|| self.grant_within(deadline))
        };
        if lease.is_none() || self.kind == Kind::Fast {
            // A fast grant writes no WAL of its own; reading the lease tables may (pruning a page,
            // or a hint bit under data checksums), which must not make its commit wait either.
            durability::skip_flush_if_alone(wal_before);
        }
        lease
    }

    /// Grants the key if there is room for this lease and nobody waits for the key; never waits. A
    /// key that another transaction is changing (granting, renewing, releasing, revoking: committed
    /// or not, it is not settled yet) or writing under (a guard: the new grant would have to wait
    /// for those writes) counts as held: `wait => 0` means an answer at once, as
    /// pg_try_advisory_lock gives one. So does a key with waiters, whichever mode they wait for:
    /// they are served first. A sweep's change of the key is waited out (until `deadline` at most,
    /// a waiting acquire's): the key is free.
    pub(super) fn grant_unless_held(&self, deadline: Option<Instant>) -> Option<Lease> {
        if !sweeps::lock_unless_held(self.key, self.key_lock(), deadline) {
            return None;
        }
        if waiting::someone_waiting(self.key) {
            keylock::unlock(self.key, self.key_lock());
            return None;
        }
        self.grant_locked(None)
    }

    /// Queues for the key (see `line::waiting`) and, first in line, grants it as soon as there is room;
    /// None when `deadline` comes first.
    fn grant_within(&self, deadline: Instant) -> Option<Lease> {
        stats::bump(Counter::WaitsBegun);
        let started = Instant::now();
        let lease = self.wait_and_grant(deadline);
        stats::waited(started.elapsed().as_micros() as u64, lease.is_some());
        lease
    }

    fn wait_and_grant(&self, deadline: Instant) -> Option<Lease> {
        if self.session_bound {
            sessions::hold_session_lock();
        }
        self.wait_in_line(deadline)
    }

    /// The lease of this call's token, granted by an earlier try of this same acquire whose reply
    /// was lost while this one waited: this call's answer.
    fn granted_to_this_token(&self, token: Uuid) -> Option<Lease> {
        let lease = lease_held_with(self.key, token, Some(self.kind))?;
        if self.session_bound {
            sessions::bound(self.key);
        }
        Some(lease)
    }

    fn wait_in_line(&self, deadline: Instant) -> Option<Lease> {
        handoff::stand(self);
        if !waiting::enter(self.key, deadline) {
            handoff::step_down(self);
            return None;
        }
        let lease = loop {
            if clock::micros_until(deadline) == 0 {
                break None;
            }
            latch::arm();
            // First let any change of the key in flight (a release, revocation, renewal or grant;
            // not the holders' fenced writes, which take no Change-conflicting lock) end: what it
            // did is then committed and read below. A change that starts later finds this waiter
            // in the waiting room and wakes it at commit (see `line::waiting`): no wake-up is lost.
            if !keylock::lock_until(self.key, Mode::Change, deadline) {
                break None;
            }
            keylock::unlock(self.key, Mode::Change);
            if let Some(lease) = self.token.and_then(|token| self.granted_to_this_token(token)) {
                break Some(lease);
            }
            if let Some(lease) = handoff::claim(self) {
                break Some(lease);
            }
            let now = clock::now();
            if let Some(held_until) = self.no_room_until(now) {
                if handoff::let_candidate_pass(self) {
                    // To the end of the queue, behind the candidate.
                    waiting::leave(self.key);
                    if !waiting::enter(self.key, deadline) {
                        handoff::step_down(self);
                        return None;
                    }
                    continue;
                }
                latch::sleep((held_until - now).min(clock::micros_until(deadline)));
                continue;
            }
            // Room: take the key lock for a grant and decide under it. An exclusive grant waits
            // there (until the deadline at most) for writers under the fence it replaces: the key
            // has no live holder to hold up. A grant beside live holders (a permit, a shared lease)
            // never waits holding the lock, which their renewals and releases take too: a writer
            // frozen in its transaction would stall them. It looks again a moment later.
            if !keylock::lock_until(self.key, self.key_lock(), deadline) {
                break None;
            }
            let writers_wait = self.mode.is_exclusive().then_some(deadline);
            if let Some(lease) = self.grant_locked(writers_wait) {
                break Some(lease);
            }
            if writers_wait.is_none() {
                latch::sleep(LOCK_POLL.min(clock::micros_until(deadline)));
            }
        };
        waiting::leave(self.key);
        handoff::step_down(self);
        lease
    }
}
