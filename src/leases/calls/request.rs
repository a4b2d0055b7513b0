//! A call that asks for a key (lease_acquire, a lease set's member, a hand-off's grant): what it
//! asks for (`Request`), whether the key's rows leave room for it, and the lease it returns.
use crate::leases::state::found::Found;
use crate::leases::state::kinds::Kind;
use crate::leases::state::mode::LeaseMode;
use crate::leases::state::{ended, rows, slots};
use crate::locks::keylock::Mode;
use crate::pg::{clock, installed};
use pgrx::prelude::*;
use pgrx::Uuid;
use std::cell::RefCell;

/// How soon (µs) a waiter looks again at a key whose lock (or guard lock) another transaction holds
/// without changing the key: that transaction's end wakes nobody.
pub(super) const LOCK_POLL: i64 = 10_000;

/// A waiter is woken when the lease ends, but a few ends come without a wake-up: a session-bound
/// lease whose session dropped its advisory locks, a release committed with COMMIT PREPARED, a
/// wake-up consumed by one of PostgreSQL's own latch waits. So a waiter looks again at least this
/// often (µs): a safety net, not the mechanism.
pub(super) const RECHECK_AT_LEAST_EVERY: i64 = 1_000_000;

/// What lease_acquire returns (the SQL type fence.lease). pg_extern signatures must spell it out.
pub(super) type Lease = pgrx::composite_type!('static, "lease");

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

pub(super) fn new_token() -> Uuid {
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
    /// How long (µs) an end other than a release keeps the key from every grant (see `state::ended`).
    pub(super) lock_delay: i64,
    /// The owner whose waiting acquire is to claim the lease (see `handoff`), or None.
    pub(super) handed_to: Option<String>,
    /// When this call first saw each session-bound lease's session gone (by kind, slot and fence),
    /// its end not yet recorded: what its lock-delay counts from (see `state::ended`).
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
            first_seen_gone: RefCell::new(Vec::new()),
        }
    }

    /// When the key's live leases leave no room for this lease at `now`, as last committed, or a
    /// lock-delay holds it back (see `state::ended`): until when a waiter may sleep (the first of them to
    /// end, and at most RECHECK_AT_LEAST_EVERY).
    pub(super) fn no_room_until(&self, now: i64) -> Option<i64> {
        let rows = rows::all(self.key, now);
        if let Some(until) = self.held_back_until(&rows, now) {
            return Some(until.min(now + RECHECK_AT_LEAST_EVERY));
        }
        if slots::slot_for(self.mode, &rows).is_some() {
            return None;
        }
        let first_end = rows.iter().filter_map(|found| found.live.as_ref()).map(|live| live.expires_at).min();
        Some(first_end.unwrap_or(now).min(now + RECHECK_AT_LEAST_EVERY))
    }

    /// Until when a lock-delay holds this grant back, given the key's rows at `now` (see `state::ended`).
    pub(super) fn held_back_until(&self, rows: &[Found], now: i64) -> Option<i64> {
        let mut seen = self.first_seen_gone.borrow_mut();
        for found in rows.iter().filter(|found| ended::session_end_unrecorded(found)) {
            let lease = (found.kind, found.slot, found.fence);
            if !seen.iter().any(|(each, _)| *each == lease) {
                seen.push((lease, now));
            }
        }
        let first_seen = |found: &Found| {
            let lease = (found.kind, found.slot, found.fence);
            seen.iter().find(|(each, _)| *each == lease).map_or(now, |(_, at)| *at)
        };
        ended::held_back_until(rows, now, first_seen)
    }
    /// How this grant takes the key lock: exclusively for an exclusive lease, as every other change
    /// of the key does; in `Change` mode for the other modes, whose grants wait for the writers of
    /// the holders they replace only (see `state::slots`).
    pub(super) fn key_lock(&self) -> Mode {
        if self.mode.is_exclusive() {
            Mode::Grant
        } else {
            Mode::Change
        }
    }
}
