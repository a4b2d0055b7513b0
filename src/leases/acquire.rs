//! lease_acquire: grants a key whose lease, of either kind, is dead, with a fence above every fence
//! the key had (see `fences`); waits for the key when asked (see `waiting`); and answers a retry
//! that brings the token of the lease it granted with that same lease.
use super::kinds::Kind;
use super::notify::{self, Event};
use super::{durability, fences, row, sessions, token_hash, waiting};
use crate::locks::keylock::{self, Mode};
use crate::pg::spi_plans::{execute, execute_first};
use crate::pg::{clock, input, installed};
use crate::stats::{self, Counter};
use pgrx::datum::Interval;
use pgrx::pg_sys::panic::ErrorReportable;
use pgrx::prelude::*;
use pgrx::Uuid;
use std::time::Instant;

/// A grant of a key whose row in `$table` exists: a new fence (see `fences`), but only when
/// the lease there is dead at $3. A plain UPDATE, not INSERT .. ON CONFLICT DO UPDATE, which would
/// also WAL-log a row lock: the key lock already keeps every other writer of this key out. $5: the
/// new token, $8: its hash (see `token_hash`); $6, $7: the session of a session-bound lease, or
/// NULL; $9: the lowest fence it may get (the clock floor, and above the other kind's fence).
macro_rules! grant_again {
    ($table:literal) => {
        concat!(
            "UPDATE ",
            $table,
            "
                SET fence = greatest(fence + 1, $9), owner = $2, token_hash = $8,
                    acquired_at = $3, expires_at = $4, session_pid = $6, session_id = $7
              WHERE key = $1 AND ",
            live_at!("$3"),
            " IS NOT TRUE RETURNING ROW(key, owner, fence, $5, acquired_at, expires_at)::fence.lease"
        )
    };
}

/// The first grant of a key that has no row in `$table`: never granted, or its row deleted by the
/// sweep after its lease ended. Its fence is `$first`.
macro_rules! grant_first {
    ($table:literal, $($first:tt)+) => {
        concat!(
            "INSERT INTO ", $table, "
                 (key, fence, owner, token_hash, acquired_at, expires_at, session_pid, session_id)
             VALUES ($1, ", $($first)+, ", $2, $8, $3, $4, $6, $7)
             ON CONFLICT (key) DO NOTHING
             RETURNING ROW(key, owner, fence, $5, acquired_at, expires_at)::fence.lease"
        )
    };
}

/// A first grant starts above the fences of every deleted row, too.
macro_rules! above_deleted {
    () => {
        "greatest($9, (SELECT h.fence + 1 FROM fence.high_water h))"
    };
}

/// After a grant, the other kind's row of the key if its lease ended without a release (it expired,
/// or its session ended): ended for good, so that a step back of the clock cannot make it live
/// again beside the new lease. (A grant of the same kind overwrites the row.)
macro_rules! end_unreleased {
    ($table:literal) => {
        concat!(
            "UPDATE ",
            $table,
            " SET token_hash = NULL, expires_at = least(expires_at, $2)
              WHERE key = $1 AND token_hash IS NOT NULL"
        )
    };
}

/// A waiter is woken when the lease ends, but a few ends come without a wake-up: a session-bound
/// lease whose session dropped its advisory locks, a release committed with COMMIT PREPARED, a
/// wake-up consumed by one of PostgreSQL's own latch waits. So a waiter looks again at least this
/// often (µs): a safety net, not the mechanism.
const RECHECK_AT_LEAST_EVERY: i64 = 1_000_000;

/// What lease_acquire returns (the SQL type fence.lease). pg_extern signatures must spell it out.
pub(super) type Lease = pgrx::composite_type!('static, "lease");

/// Grants the key for `ttl` and returns the lease. When another live lease holds the key: NULL at
/// once, or with `wait`, after waiting up to `wait` for the key to become free (NULL if it did not).
/// A `session_bound` lease also ends when this session ends; a lease that is not `durable` lives in
/// unlogged state (see `kinds`).
#[pg_extern(name = "lease_acquire", volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn acquire(
    key: Option<&str>,
    ttl: Option<Interval>,
    owner: default!(Option<&str>, "NULL"),
    wait: default!(Option<Interval>, "'0'"),
    session_bound: default!(Option<bool>, "false"),
    durable: default!(Option<bool>, "true"),
    token: default!(Option<Uuid>, "NULL"),
) -> Option<pgrx::composite_type!('static, "lease")> {
    let (key, ttl, owner) = (input::key(key), input::ttl(ttl), input::owner(owner));
    let wait = input::wait(wait);
    let session_bound = input::required(session_bound, "session_bound");
    let kind = Kind::of(input::required(durable, "durable"));
    let token = token.map(input::token);
    durability::require_writable("acquire a lease");
    // A retry of an acquire whose reply was lost: the lease it granted, as it was granted.
    let wal_before = durability::wal_position();
    if let Some(lease) = token.and_then(|token| lease_held_with(key, token)) {
        durability::skip_flush_if_alone(wal_before);
        return Some(lease);
    }
    let lease = Request { key, ttl, owner, session_bound, kind, token }.acquire(wait);
    stats::bump(match (&lease, kind) {
        (None, _) => Counter::AcquiresRefused,
        (Some(_), Kind::Durable) => Counter::GrantsDurable,
        (Some(_), Kind::Fast) => Counter::GrantsFast,
    });
    lease
}

/// The key's live lease, as last committed, if `token` holds it: (key, owner, fence, token,
/// acquired_at, expires_at), unchanged.
fn lease_held_with(key: &str, token: Uuid) -> Option<Lease> {
    let held = row::held_with(key, &token_hash(token), clock::now())?;
    let args = [
        key.into(),
        held.owner.as_str().into(),
        held.fence.into(),
        token.into(),
        clock::timestamp(held.acquired_at).into(),
        clock::timestamp(held.expires_at).into(),
    ];
    execute_first::<Lease>("SELECT ROW($1, $2, $3, $4, $5, $6)::fence.lease", &args)
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

pub(super) struct Request<'a> {
    pub(super) key: &'a str,
    pub(super) ttl: i64,
    pub(super) owner: String,
    pub(super) session_bound: bool,
    pub(super) kind: Kind,
    /// The token the caller chose, or None for a fresh random one.
    pub(super) token: Option<Uuid>,
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
            self.grant_unless_held()
        } else {
            let deadline = clock::deadline_after(wait);
            self.grant_unless_held().or_else(|| self.grant_within(deadline))
        };
        if lease.is_none() || self.kind == Kind::Fast {
            // A fast grant writes no WAL of its own; reading the lease tables may (pruning a page,
            // or a hint bit under data checksums), which must not make its commit wait either.
            durability::skip_flush_if_alone(wal_before);
        }
        lease
    }

    /// Grants the key if it is free and nobody waits for it; never waits. A key that another
    /// transaction is changing (granting, renewing, releasing, revoking: committed or not, it is
    /// not free yet) or writing under (a guard: the new grant would have to wait for those writes)
    /// counts as held: `wait => 0` means an answer at once, as pg_try_advisory_lock gives one.
    fn grant_unless_held(&self) -> Option<Lease> {
        if !keylock::try_lock(self.key, Mode::Grant) {
            return None;
        }
        if waiting::someone_waiting(self.key) {
            keylock::unlock(self.key, Mode::Grant);
            return None;
        }
        self.grant_locked()
    }

    /// Queues for the key (see `waiting`) and, first in line, grants it as soon as it is free;
    /// None when `deadline` comes first.
    fn grant_within(&self, deadline: Instant) -> Option<Lease> {
        stats::bump(Counter::WaitsBegun);
        let started = Instant::now();
        let lease = self.wait_and_grant(deadline);
        stats::waited(started.elapsed().as_micros() as u64, lease.is_some());
        lease
    }

    fn wait_and_grant(&self, deadline: Instant) -> Option<Lease> {
        if !waiting::enter(self.key, deadline) {
            return None;
        }
        let lease = loop {
            if clock::micros_until(deadline) == 0 {
                break None;
            }
            waiting::arm();
            // First let any change of the key in flight (a release, revocation, renewal or grant;
            // not the holder's fenced writes, which take no Change-conflicting lock) end: what it
            // did is then committed and read below. A change that starts later finds this waiter
            // in the waiting room and wakes it at commit (see `waiting`): no wake-up is lost.
            if !keylock::lock_until(self.key, Mode::Change, deadline) {
                break None;
            }
            keylock::unlock(self.key, Mode::Change);
            // An earlier try of this same acquire (its reply lost, its call still queued here) may
            // have been granted meanwhile: that lease is this call's answer.
            if let Some(lease) = self.token.and_then(|token| lease_held_with(self.key, token)) {
                break Some(lease);
            }
            let now = clock::now();
            if let Some(held_until) = live_until(self.key, now) {
                waiting::sleep((held_until - now).min(clock::micros_until(deadline)));
                continue;
            }
            // Free: take the key lock for a grant, waiting (until the deadline at most) for writers
            // under the old fence, and decide under the lock.
            if !keylock::lock_until(self.key, Mode::Grant, deadline) {
                break None;
            }
            if let Some(lease) = self.grant_locked() {
                break Some(lease);
            }
        };
        waiting::leave(self.key);
        lease
    }

    /// With the key lock held: grants the key if its lease, of either kind, is dead now, else gives
    /// the lock back. The fence starts above the other kind's last one.
    pub(super) fn grant_locked(&self) -> Option<Lease> {
        let now = clock::now();
        let own = row::find(self.kind, self.key, now);
        let other = row::find(self.kind.other(), self.key, now);
        if own.iter().chain(&other).any(|found| found.live.is_some()) {
            keylock::unlock(self.key, Mode::Grant);
            return None;
        }
        let floor = fences::floor(now, other.as_ref().map(|found| found.fence));
        let token = self.token.unwrap_or_else(|| Uuid::from_bytes(*uuid::Uuid::new_v4().as_bytes()));
        let session = self.session_bound.then(sessions::hold_session_lock);
        let args = [
            self.key.into(),
            self.owner.as_str().into(),
            clock::timestamp(now).into(),
            clock::timestamp(now + self.ttl).into(),
            token.into(),
            session.map(|(pid, _)| pid).into(),
            session.map(|(_, id)| id).into(),
            token_hash(token).into(),
            floor.into(),
        ];
        let (again, first) = match self.kind {
            Kind::Fast => (
                grant_again!("fence.fast_lease_state"),
                grant_first!("fence.fast_lease_state", above_deleted!()),
            ),
            Kind::Durable if installed::since_0_4_0() => {
                (grant_again!("fence.lease_state"), grant_first!("fence.lease_state", above_deleted!()))
            }
            // Before ALTER EXTENSION UPDATE has created fence.high_water, nothing was deleted yet.
            Kind::Durable => (grant_again!("fence.lease_state"), grant_first!("fence.lease_state", "$9")),
        };
        // The row found above tells which statement grants the key. Under REPEATABLE READ or
        // SERIALIZABLE, the UPDATE may not see a row committed after the snapshot: then the INSERT
        // runs into it and fails with 40001, as a write conflict under those levels does.
        let granted_again = if own.is_some() { execute_first::<Lease>(again, &args) } else { None };
        let (lease, first) = match granted_again {
            Some(lease) => (Some(lease), false),
            None => (execute_first::<Lease>(first, &args), true),
        };
        let Some(lease) = lease else {
            keylock::unlock(self.key, Mode::Grant);
            return None;
        };
        let fence = lease.get_by_name::<i64>("fence").unwrap_or_report().unwrap_or_default();
        if first {
            fences::check_first_grant(fence);
        }
        self.settle(other.as_ref(), fence, now);
        if self.session_bound {
            sessions::bound(self.key);
        }
        if self.kind == Kind::Durable {
            durability::require_durable_commit();
        }
        notify::send(Event::Acquired, self.key, fence);
        Some(lease)
    }

    /// What a grant of `fence` at `now` must settle beyond its own row: a fast fence covered by the
    /// fast reservation (see `fences`), and the other kind's lease ended for good if it ended
    /// without a release (see `end_unreleased!`); nearly always nothing.
    fn settle(&self, other: Option<&row::Found>, fence: i64, now: i64) {
        if self.kind == Kind::Fast {
            fences::reserve_fast_fence(fence, now);
        }
        if other.is_some_and(|found| found.unreleased) {
            let args = [self.key.into(), clock::timestamp(now).into()];
            execute(by_kind!(self.kind.other(), end_unreleased), &args, |_| ());
            // Lost in a crash, the end of a durable lease would let it live again after a step back
            // of the clock, beside the new lease; a crash forgets a fast one anyway.
            if self.kind.other() == Kind::Durable {
                durability::require_durable_commit();
            }
        }
    }
}

/// When the key's lease is live at `now`, as last committed: until when a waiter may sleep.
pub(super) fn live_until(key: &str, now: i64) -> Option<i64> {
    let lease = row::live(key, now)?;
    Some(lease.expires_at.min(now + RECHECK_AT_LEAST_EVERY))
}
