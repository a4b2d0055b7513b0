//! lease_acquire: grants a key whose lease, of either kind, is dead, with a fence above every fence
//! the key had (see `fences`); waits for the key when asked (see `waiting`); and answers a retry
//! that brings the token of the lease it granted with that same lease.
use super::kinds::Kind;
use super::modes::LeaseMode;
use super::notify::{self, Event};
use super::{
    durability, ended, fences, handoff, memory, next_in_line, row, sessions, token_hash, token_hash_array,
    waiting,
};
use crate::locks::keylock::{self, Mode};
use crate::pg::spi_plans::{execute, execute_first};
use crate::pg::{clock, input, installed};
use crate::stats::{self, Counter};
use pgrx::datum::Interval;
use pgrx::pg_sys::panic::ErrorReportable;
use pgrx::prelude::*;
use pgrx::{PgTryBuilder, Uuid};
use std::cell::RefCell;
use std::panic::AssertUnwindSafe;
use std::time::Instant;

/// A grant of a key's slot whose row in `$table` exists: a new fence (see `fences`), but only when
/// the lease there is dead at $3. A plain UPDATE, not INSERT .. ON CONFLICT DO UPDATE, which would
/// also WAL-log a row lock: the key lock already keeps every other writer of this key out. $5: the
/// new token, $8: its hash (see `token_hash`); $6, $7: the session of a session-bound lease, or
/// NULL; $9: the lowest fence it may get (the clock floor, and above every other row of the key);
/// $10, $11, $12: its slot, shared and permits (see `modes`); $13: the owner it is handed to (see
/// `handoff`), or NULL; $14: its lock_delay (µs). The row's unreleased lease, which it replaces,
/// has its end recorded (see `ended`). `before_0_5_0`: the same over the objects of older
/// versions, whose tables have one exclusive row per key.
macro_rules! grant_again {
    ($table:literal) => {
        grant_again!(
            $table,
            concat!(
                ", shared = $11, permits = $12, handed_to = $13, lock_delay = $14,
                    ended_hash = coalesce(token_hash, ended_hash),
                    ended_fence = CASE WHEN token_hash IS NULL THEN ended_fence ELSE fence END,
                    ended_at = CASE WHEN token_hash IS NULL THEN ended_at ELSE least(expires_at, $3) END,
                    ended_reason = CASE WHEN token_hash IS NULL THEN ended_reason ELSE ",
                involuntary_end!("$3"),
                " END"
            ),
            " AND slot = $10"
        )
    };
    ($table:literal, before_0_5_0) => {
        grant_again!($table, "", "")
    };
    ($table:literal, $set:expr, $slot:literal) => {
        concat!(
            "UPDATE ",
            $table,
            "
                SET fence = greatest(fence + 1, $9), owner = $2, token_hash = $8,
                    acquired_at = $3, expires_at = $4, session_pid = $6, session_id = $7",
            $set,
            "
              WHERE key = $1",
            $slot,
            " AND ",
            live_at!("$3"),
            " IS NOT TRUE RETURNING ROW(key, owner, fence, $5, acquired_at, expires_at)::fence.lease"
        )
    };
}

/// The first grant of a key's slot that has no row in `$table`: never granted, or its row deleted by
/// the sweep after its lease ended. Its fence is `$first`. `before_0_5_0`: without the slot and the
/// mode, which the tables of older versions lack.
macro_rules! grant_first {
    ($table:literal, $first:expr) => {
        grant_first!(
            $table,
            "key, slot, shared, permits, handed_to, lock_delay",
            "$1, $10, $11, $12, $13, $14",
            $first
        )
    };
    ($table:literal, before_0_5_0, $first:expr) => {
        grant_first!($table, "key", "$1", $first)
    };
    ($table:literal, $columns:literal, $values:literal, $first:expr) => {
        concat!(
            "INSERT INTO ",
            $table,
            " (",
            $columns,
            ", fence, owner, token_hash, acquired_at, expires_at,
                                       session_pid, session_id)
             VALUES (",
            $values,
            ", ",
            $first,
            ", $2, $8, $3, $4, $6, $7)
             ON CONFLICT DO NOTHING
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

/// After a grant, the key's other rows whose leases ended without a release (they expired, or
/// their sessions ended): ended for good, so that a step back of the clock cannot make one live
/// again beside the new lease. (The grant overwrote its own slot's row, now live at $2.)
macro_rules! end_unreleased {
    ($table:literal) => {
        end_unreleased!($table, concat!(", ", record_end!(involuntary_end!("$2"), "least(expires_at, $2)")))
    };
    ($table:literal, before_0_5_0) => {
        end_unreleased!($table, "")
    };
    ($table:literal, $record:expr) => {
        concat!(
            "UPDATE ",
            $table,
            " SET token_hash = NULL, expires_at = least(expires_at, $2)",
            $record,
            "
              WHERE key = $1 AND token_hash IS NOT NULL AND NOT ",
            live_at!("$2")
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

/// Grants the key for `ttl` and returns the lease. When the live leases of the key leave no room
/// for it (see `modes`): NULL at once, or with `wait`, after waiting up to `wait` for room (NULL if
/// none came). A `session_bound` lease also ends when this session ends; a lease that is not
/// `durable` lives in unlogged state (see `kinds`); a `shared` one beside other shared ones, and
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
    // A waiter's token is chosen before it waits, so that a release can grant the key in its name
    // (see `next_in_line`).
    let token = token.or_else(|| (wait > 0).then(new_token));
    let request = Request { lock_delay, ..Request::new(key, ttl, owner, session_bound, kind, token, mode) };
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
/// `row::held_with_of_kind`).
fn lease_held_with(key: &str, token: Uuid, kind: Option<Kind>) -> Option<Lease> {
    let (hash, now) = (token_hash(token), clock::now());
    let held = match kind {
        Some(kind) => row::held_with_of_kind(kind, key, &hash, now),
        None => row::held_with(key, &hash, now),
    }?;
    Some(lease_value(key, &held.owner, held.fence, token, held.acquired_at, held.expires_at))
}

/// A value of type fence.lease, made in place: a statement to make it would cost a grant in
/// shared memory more than the grant itself.
pub(super) fn lease_value(
    key: &str,
    owner: &str,
    fence: i64,
    token: Uuid,
    acquired_at: i64,
    expires_at: i64,
) -> Lease {
    fn damaged() -> ! {
        crate::pg::errors::state_damaged(
            "type fence.lease is not (text, text, bigint, uuid, timestamptz, timestamptz)",
        )
    }
    use pg_sys::{INT8OID, TEXTOID, TIMESTAMPTZOID, UUIDOID};
    let types = [TEXTOID, TEXTOID, INT8OID, UUIDOID, TIMESTAMPTZOID, TIMESTAMPTZOID];
    let desc = installed::lease_type().and_then(pgrx::PgTupleDesc::for_composite_type_by_oid);
    let Some(desc) = desc.filter(|desc| {
        desc.len() == types.len() && desc.iter().zip(types).all(|(column, wanted)| column.atttypid == wanted)
    }) else {
        damaged()
    };
    let values = [
        key.into_datum(),
        owner.into_datum(),
        fence.into_datum(),
        token.into_datum(),
        clock::timestamp(acquired_at).into_datum(),
        clock::timestamp(expires_at).into_datum(),
    ];
    // SAFETY: each value is of its column's type, checked above.
    unsafe { Lease::from_datums(desc, values) }.unwrap_or_else(|_| damaged())
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

fn new_token() -> Uuid {
    Uuid::from_bytes(*uuid::Uuid::new_v4().as_bytes())
}

/// A lease among a key's rows: its kind, slot and fence.
type LeaseId = (Kind, i32, i64);

pub(super) struct Request<'a> {
    pub(super) key: &'a str,
    pub(super) ttl: i64,
    pub(super) owner: String,
    pub(super) session_bound: bool,
    pub(super) kind: Kind,
    /// The token the caller chose, or None for a fresh random one.
    pub(super) token: Option<Uuid>,
    pub(super) mode: LeaseMode,
    /// How long (µs) an end other than a release keeps the key from every grant (see `ended`).
    pub(super) lock_delay: i64,
    /// The owner whose waiting acquire is to claim the lease (see `handoff`), or None.
    pub(super) handed_to: Option<String>,
    /// The waiting backend's session, for a session-bound lease a release grants on its behalf (see
    /// `next_in_line`); None: this backend's.
    pub(super) holder_session: Option<(i32, i64)>,
    /// When this call first saw each session-bound lease's session gone (by kind, slot and fence),
    /// its end not yet recorded: what its lock-delay counts from (see `ended`).
    first_seen_gone: RefCell<Vec<(LeaseId, i64)>>,
}

impl<'a> Request<'a> {
    pub(super) fn new(
        key: &'a str,
        ttl: i64,
        owner: String,
        session_bound: bool,
        kind: Kind,
        token: Option<Uuid>,
        mode: LeaseMode,
    ) -> Self {
        Request {
            key,
            ttl,
            owner,
            session_bound,
            kind,
            token,
            mode,
            lock_delay: 0,
            handed_to: None,
            holder_session: None,
            first_seen_gone: RefCell::new(Vec::new()),
        }
    }

    /// When the key's live leases leave no room for this lease at `now`, as last committed, or a
    /// lock-delay holds it back (see `ended`): until when a waiter may sleep (the first of them to
    /// end, and at most RECHECK_AT_LEAST_EVERY).
    pub(super) fn no_room_until(&self, now: i64) -> Option<i64> {
        let rows = row::all(self.key, now);
        if let Some(until) = self.held_back_until(&rows, now) {
            return Some(until.min(now + RECHECK_AT_LEAST_EVERY));
        }
        if self.mode.slot_for(&rows).is_some() {
            return None;
        }
        let first_end = rows.iter().filter_map(|found| found.live.as_ref()).map(|live| live.expires_at).min();
        Some(first_end.unwrap_or(now).min(now + RECHECK_AT_LEAST_EVERY))
    }

    /// Until when a lock-delay holds this grant back, given the key's rows at `now` (see `ended`).
    pub(super) fn held_back_until(&self, rows: &[row::Found], now: i64) -> Option<i64> {
        let mut seen = self.first_seen_gone.borrow_mut();
        for found in rows.iter().filter(|found| ended::session_end_unrecorded(found)) {
            let lease = (found.kind, found.slot, found.fence);
            if !seen.iter().any(|(each, _)| *each == lease) {
                seen.push((lease, now));
            }
        }
        let first_seen = |found: &row::Found| {
            let lease = (found.kind, found.slot, found.fence);
            seen.iter().find(|(each, _)| *each == lease).map_or(now, |(_, at)| *at)
        };
        ended::held_back_until(rows, now, first_seen)
    }

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

    /// How this grant takes the key lock: exclusively for an exclusive lease, as every other change
    /// of the key does; in `Change` mode for the other modes, whose grants wait for the writers of
    /// the holders they replace only (see `modes`).
    pub(super) fn key_lock(&self) -> Mode {
        if self.mode.is_exclusive() {
            Mode::Grant
        } else {
            Mode::Change
        }
    }

    /// Grants the key if there is room for this lease and nobody waits for the key; never waits. A
    /// key that another transaction is changing (granting, renewing, releasing, revoking: committed
    /// or not, it is not settled yet) or writing under (a guard: the new grant would have to wait
    /// for those writes) counts as held: `wait => 0` means an answer at once, as
    /// pg_try_advisory_lock gives one. So does a key with waiters, whichever mode they wait for:
    /// they are served first.
    fn grant_unless_held(&self) -> Option<Lease> {
        if !keylock::try_lock(self.key, self.key_lock()) {
            return None;
        }
        if waiting::someone_waiting(self.key) {
            keylock::unlock(self.key, self.key_lock());
            return None;
        }
        self.grant_locked(None)
    }

    /// Queues for the key (see `waiting`) and, first in line, grants it as soon as there is room;
    /// None when `deadline` comes first.
    fn grant_within(&self, deadline: Instant) -> Option<Lease> {
        stats::bump(Counter::WaitsBegun);
        let started = Instant::now();
        let lease = self.wait_and_grant(deadline);
        stats::waited(started.elapsed().as_micros() as u64, lease.is_some());
        lease
    }

    fn wait_and_grant(&self, deadline: Instant) -> Option<Lease> {
        let session = self.session_bound.then(sessions::hold_session_lock);
        if !next_in_line::post(self, session) {
            return self.wait_in_line(deadline);
        }
        // Withdrawn on every path, errors included, the wait for a release that chose it too.
        PgTryBuilder::new(AssertUnwindSafe(|| {
            let waited = self.wait_in_line(deadline);
            let granted_since = || self.token.and_then(|token| self.granted_by_a_release(token));
            next_in_line::withdraw(waited, granted_since)
        }))
        .catch_others(|error| {
            next_in_line::withdraw_on_error();
            error.rethrow()
        })
        .execute()
    }

    /// A lease of this call's token that a release granted (see `next_in_line`), or an earlier try
    /// of this same acquire (its reply lost, its call still queued): made as durable as a grant of
    /// this call's own, and this call's answer.
    fn granted_by_a_release(&self, token: Uuid) -> Option<Lease> {
        // Of this call's kind, as a release grants it: a fast waiter reads no durable row here.
        let lease = lease_held_with(self.key, token, Some(self.kind))?;
        if self.session_bound {
            sessions::bound(self.key);
        }
        if self.kind == Kind::Durable {
            durability::wait_until_durable(next_in_line::granted_at_lsn());
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
            waiting::arm();
            // First let any change of the key in flight (a release, revocation, renewal or grant;
            // not the holders' fenced writes, which take no Change-conflicting lock) end: what it
            // did is then committed and read below. A change that starts later finds this waiter
            // in the waiting room and wakes it at commit (see `waiting`): no wake-up is lost.
            if !keylock::lock_until(self.key, Mode::Change, deadline) {
                break None;
            }
            keylock::unlock(self.key, Mode::Change);
            // A release may have granted the key to this call's token (see `next_in_line`).
            if let Some(lease) = self.token.and_then(|token| self.granted_by_a_release(token)) {
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
                waiting::sleep((held_until - now).min(clock::micros_until(deadline)));
                continue;
            }
            // Room: take the key lock for a grant, waiting (until the deadline at most) for writers
            // under the fences it replaces, and decide under the lock.
            if !keylock::lock_until(self.key, self.key_lock(), deadline) {
                break None;
            }
            if let Some(lease) = self.grant_locked(Some(deadline)) {
                break Some(lease);
            }
        };
        waiting::leave(self.key);
        handoff::step_down(self);
        lease
    }

    /// With the key lock held: grants the key if there is room for this lease now, else gives the
    /// lock back. First it takes the guard locks of the holders it replaces (see `modes`), at once
    /// without a deadline, else waiting until it at most; None, giving back all locks, when it
    /// cannot. The fence starts above every fence of the key.
    pub(super) fn grant_locked(&self, deadline: Option<Instant>) -> Option<Lease> {
        let decided_at = clock::now();
        let rows = row::all(self.key, decided_at);
        if self.held_back_until(&rows, decided_at).is_some() {
            keylock::unlock(self.key, self.key_lock());
            return None;
        }
        let Some(slot) = self.mode.slot_for(&rows) else {
            keylock::unlock(self.key, self.key_lock());
            return None;
        };
        let guard_locks = self.mode.locks_to_wait_for(slot, &rows);
        if !keylock::lock_guards_for_grant(self.key, &guard_locks, deadline) {
            keylock::unlock(self.key, self.key_lock());
            return None;
        }
        // Under the key lock nobody else grants or renews: the holders found ended stay ended while
        // the guard locks are waited for. Read the clock after that wait, never before the decision.
        let now = clock::now().max(decided_at);
        let floor = fences::floor(now, rows.iter().map(|found| found.fence).max());
        // The first grant after a reset of the fast leases waits for the clock (see `fences`): the
        // lease starts after that wait, not before it.
        let now = clock::now().max(now);
        let token = self.token.unwrap_or_else(new_token);
        let session =
            self.session_bound.then(|| self.holder_session.unwrap_or_else(sessions::hold_session_lock));
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
            slot.into(),
            self.mode.shared.into(),
            self.mode.permits.into(),
            self.handed_to.as_deref().into(),
            self.lock_delay.into(),
        ];
        // The row found above tells which statement grants the slot. Under REPEATABLE READ or
        // SERIALIZABLE, the UPDATE may not see a row committed after the snapshot: then the INSERT
        // runs into it and fails with 40001, as a write conflict under those levels does.
        let own_row = rows.iter().any(|found| found.kind == self.kind && found.slot == slot);
        let (lease, first) = if self.kind == Kind::Fast && memory::changes::in_use() {
            // Shared memory is read as last committed, never through a snapshot.
            (self.grant_in_memory(slot, now, token, session, floor), false)
        } else {
            let (again, first) = self.statements();
            let granted_again = if own_row { execute_first::<Lease>(again, &args) } else { None };
            match granted_again {
                Some(lease) => (Some(lease), false),
                None => (execute_first::<Lease>(first, &args), true),
            }
        };
        let Some(lease) = lease else {
            keylock::unlock_guards_for_grant(self.key, &guard_locks);
            keylock::unlock(self.key, self.key_lock());
            return None;
        };
        let fence = lease.get_by_name::<i64>("fence").unwrap_or_report().unwrap_or_default();
        if first {
            fences::check_first_grant(fence);
        }
        self.settle(&rows, slot, fence, now);
        if self.session_bound && self.holder_session.is_none() {
            sessions::bound(self.key);
        }
        if self.kind == Kind::Durable {
            durability::require_durable_commit();
        }
        notify::send(Event::Acquired, self.key, fence);
        waiting::wake_at_commit(self.key); // observers (see `observe`)
        Some(lease)
    }

    /// `grant_again!` or `grant_first!` for a fast lease in shared memory (see `memory`).
    fn grant_in_memory(
        &self,
        slot: i32,
        now: i64,
        token: Uuid,
        session: Option<(i32, i64)>,
        floor: i64,
    ) -> Option<Lease> {
        let grant = memory::changes::Grant {
            slot,
            owner: &self.owner,
            token_hash: token_hash_array(token),
            acquired_at: now,
            expires_at: now + self.ttl,
            session,
            mode: self.mode,
            handed_to: self.handed_to.as_deref(),
            lock_delay: self.lock_delay,
        };
        let fence = memory::changes::grant(self.key, &grant, floor)?;
        Some(lease_value(self.key, &self.owner, fence, token, now, now + self.ttl))
    }

    /// The statements that grant a slot of this kind again, and for the first time.
    fn statements(&self) -> (&'static str, &'static str) {
        if installed::since_0_5_0() {
            return match self.kind {
                Kind::Fast => (
                    grant_again!("fence.fast_lease_state"),
                    grant_first!("fence.fast_lease_state", above_deleted!()),
                ),
                Kind::Durable => {
                    (grant_again!("fence.lease_state"), grant_first!("fence.lease_state", above_deleted!()))
                }
            };
        }
        match self.kind {
            Kind::Fast => (
                grant_again!("fence.fast_lease_state", before_0_5_0),
                grant_first!("fence.fast_lease_state", before_0_5_0, above_deleted!()),
            ),
            Kind::Durable if installed::since_0_4_0() => (
                grant_again!("fence.lease_state", before_0_5_0),
                grant_first!("fence.lease_state", before_0_5_0, above_deleted!()),
            ),
            // Before ALTER EXTENSION UPDATE has created fence.high_water, nothing was deleted yet.
            Kind::Durable => (
                grant_again!("fence.lease_state", before_0_5_0),
                grant_first!("fence.lease_state", before_0_5_0, "$9"),
            ),
        }
    }

    /// What a grant of `fence` into `slot` at `now` must settle beyond its own row: a fast fence
    /// covered by the fast reservation (see `fences`), and the key's other leases that ended
    /// without a release ended for good (see `end_unreleased!`); nearly always nothing.
    fn settle(&self, rows: &[row::Found], slot: i32, fence: i64, now: i64) {
        if self.kind == Kind::Fast {
            fences::reserve_fast_fence(fence, now);
        }
        let overwritten = |found: &row::Found| found.kind == self.kind && found.slot == slot;
        for kind in [Kind::Durable, Kind::Fast] {
            let unreleased = |found: &row::Found| {
                found.kind == kind && found.unreleased && found.live.is_none() && !overwritten(found)
            };
            if !rows.iter().any(unreleased) {
                continue;
            }
            if kind == Kind::Fast && memory::changes::in_use() {
                memory::changes::end_unreleased(self.key, now);
                continue;
            }
            let args = [self.key.into(), clock::timestamp(now).into()];
            execute(by_objects!(kind, end_unreleased), &args, |_| ());
            // Lost in a crash, the end of a durable lease would let it live again after a step back
            // of the clock, beside the new lease; a crash forgets a fast one anyway.
            if kind == Kind::Durable {
                durability::require_durable_commit();
            }
        }
    }
}
