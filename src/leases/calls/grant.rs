//! The grant itself, with the key lock held: the slot it takes (see `state::slots`), the writers it
//! waits for, its fence (see `state::fences`), and its row, in a table or in shared memory.
use super::request::{lease_value, new_token, Lease, Request};
use crate::leases::line::notify::{self, Event};
use crate::leases::line::sessions;
use crate::leases::line::wakeups;
use crate::leases::state::found::Found;
use crate::leases::state::kinds::Kind;
use crate::leases::state::token::token_hash;
use crate::leases::state::{durability, fences, memory, rows, slots, token::token_hash_array};
use crate::locks::keylock::{self, GuardLock};
use crate::pg::spi_plans::{execute, execute_first};
use crate::pg::{clock, installed};
use pgrx::pg_sys::panic::ErrorReportable;
use pgrx::Uuid;
use std::time::Instant;

/// A grant of a key's slot whose row in `$table` exists: a new fence (see `state::fences`), but only when
/// the lease there is dead at $3. A plain UPDATE, not INSERT .. ON CONFLICT DO UPDATE, which would
/// also WAL-log a row lock: the key lock already keeps every other writer of this key out. $5: the
/// new token, $8: its hash (see `token_hash`); $6, $7: the session of a session-bound lease, or
/// NULL; $9: the lowest fence it may get (the clock floor, and above every other row of the key);
/// $10, $11, $12: its slot, shared and permits (see `state::slots`); $13: the owner it is handed to (see
/// `handoff`), or NULL; $14: its lock_delay (µs). The row's unreleased lease, which it replaces,
/// has its end recorded (see `state::ended`). `before_0_5_0`: the same over the objects of older
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

impl Request<'_> {
    /// For a lease set, with the key lock held: takes at once the guard locks a grant of this
    /// request would wait for (see `state::slots`), kept to the transaction's end as the grant's own are:
    /// the locks, or None, holding none of them, when a writer under an ended lease still has one.
    pub(super) fn take_guard_locks_at_once(&self) -> Option<Vec<GuardLock>> {
        let rows = rows::all(self.key, clock::now());
        slots::take_slot(self.key, self.mode, &rows, None).map(|(_, locks)| locks)
    }

    /// With the key lock held: grants the key if there is room for this lease now, else gives the
    /// lock back. First it takes the guard locks of the holders it replaces (see `state::slots`), at once
    /// without a deadline, else waiting until it at most; None, giving back all locks, when it
    /// cannot. The fence starts above every fence of the key.
    pub(super) fn grant_locked(&self, deadline: Option<Instant>) -> Option<Lease> {
        let decided_at = clock::now();
        let rows = rows::all(self.key, decided_at);
        if self.held_back_until(&rows, decided_at).is_some() {
            keylock::unlock(self.key, self.key_lock());
            return None;
        }
        let Some((slot, guard_locks)) = slots::take_slot(self.key, self.mode, &rows, deadline) else {
            keylock::unlock(self.key, self.key_lock());
            return None;
        };
        // Under the key lock nobody else grants or renews: the holders found ended stay ended while
        // the guard locks are waited for. Read the clock after that wait, never before the decision.
        let now = clock::now().max(decided_at);
        let floor = fences::floor(now, rows.iter().map(|found| found.fence).max());
        // The first grant after a reset of the fast leases waits for the clock (see `state::fences`): the
        // lease starts after that wait, not before it.
        let now = clock::now().max(now);
        let token = self.token.unwrap_or_else(new_token);
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
        if self.session_bound {
            sessions::bound(self.key);
        }
        if self.kind == Kind::Durable {
            durability::require_durable_commit();
        }
        notify::send(Event::Acquired, self.key, fence);
        wakeups::wake_at_commit(self.key); // observers (see `observe`)
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
    /// covered by the fast reservation (see `state::fences`), and the key's other leases that ended
    /// without a release ended for good (see `end_unreleased!`); nearly always nothing.
    fn settle(&self, rows: &[Found], slot: i32, fence: i64, now: i64) {
        if self.kind == Kind::Fast {
            fences::reserve_fast_fence(fence, now);
        }
        let overwritten = |found: &Found| found.kind == self.kind && found.slot == slot;
        for kind in [Kind::Durable, Kind::Fast] {
            let unreleased = |found: &Found| {
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
