//! How a grant's fence is chosen: the greater of the key's previous fence + 1 and the server clock
//! in microseconds since 1970.
//!
//! "Previous + 1" makes the fences of one history strictly increase whatever the clock does. The
//! clock orders histories: a server rolled onto another history (a promoted standby that missed the
//! last WAL, a cancelled synchronous commit wait, point-in-time recovery, a restored dump, DROP and
//! CREATE EXTENSION) forgets the fences it lost, but its clock has moved on since they were issued,
//! so its next grant is above them. The one assumption is that clock: a fence issued on the lost
//! history is at most the clock reading at its grant (plus one per grant of that key within the
//! same microsecond or after a step back), so the new history's clock must read later than that at
//! its first grant of the key (docs/guarantees.md, "Fences, and the one clock assumption").
//!
//! Two durable marks keep fences rising where the clock does not, after a step back:
//! - A key's rows may be deleted once their leases ended long enough ago (pg_fence.retain_ended,
//!   see `sweeper`), one kind's row before the other's. The sweep raises the high-water mark, table
//!   fence.high_water, to the deleted fences in the same transaction, and every grant starts above
//!   that mark (`floor`): so a key granted again gets a fence above its deleted ones.
//! - A crash, an immediate shutdown or a failover forgets the fast leases and their fences (see
//!   `kinds`). Every fast fence is at most the fast reservation, table fence.fast_reserve, raised
//!   and flushed before a fast fence above it is told (`reserve_fast_fence`), a few seconds ahead of
//!   the clock so that a steady stream of fast grants flushes once per RESERVE_AHEAD. After such a
//!   reset every grant, in every backend and of every key and kind, starts above the reservation
//!   as it stood at the reset (`reset_floor`). Each backend's first grant reads it, unless the
//!   reset marker, a row of the unlogged table that the reset empties, already holds that floor:
//!   a first grant under READ COMMITTED writes it there (one transaction at a time). No backend
//!   lives through a reset (a crash restart ends them all; a standby's backends cannot grant
//!   before its promotion), so a backend looks once, at its first grant. With fast leases in
//!   shared memory, which even a clean shutdown forgets, the marker also names the shared memory
//!   it was written under.
//!
//! Grants above the reservation would run ahead of the clock, by up to RESERVE_AHEAD, and a history
//! that then forgets them with the reservation (DROP and CREATE EXTENSION, a restored dump or a
//! recovery that ends before the raise, an asynchronous standby that missed it) could start below
//! them. So the first grant after a reset waits until the clock has passed the reservation, and
//! fences stay at the clock; only a reservation further ahead than any raise reaches, which a step
//! back of the clock makes, is jumped over at once.
//!
//! (Over the objects of a version before 0.4.0, which have neither table, grants start at the clock
//! floor alone: those versions have no fast leases, and their sweep deletes nothing.)

use crate::leases::state::durability;
use crate::locks::keylock::{self, Owner};
use crate::pg::installed;
use crate::pg::spi_plans::{execute, execute_first};
use pgrx::{pg_sys, register_xact_callback, PgXactCallbackEvent};
use std::cell::Cell;

/// Microseconds from 1970-01-01 (the Unix epoch) to 2000-01-01 (PostgreSQL's).
const UNIX_TO_POSTGRES_EPOCH: i64 = 946_684_800_000_000;

/// How far ahead of the clock (µs) a raise of the fast reservation reaches: a steady stream of fast
/// grants flushes once per this long, and the first grant after a reset waits at most this long.
const RESERVE_AHEAD: i64 = 2_000_000;
/// How far ahead of the clock a first grant after a reset still waits for the reservation (µs):
/// beyond that the clock has been stepped back, and the grant goes above the reservation at once.
/// As far as an older version's raise reached (10 s), and a second.
const WAIT_AT_MOST: i64 = 11_000_000;

thread_local! {
    /// `reset_floor` of this backend, with the OID of the fence.fast_reserve it was read from (DROP
    /// and CREATE EXTENSION make a new table).
    static RESET_FLOOR: Cell<Option<(pg_sys::Oid, i64)>> = const { Cell::new(None) };
    /// The highest fast reservation this backend knows to be committed (and flushed).
    static KNOWN_RESERVED: Cell<Option<(pg_sys::Oid, i64)>> = const { Cell::new(None) };
    /// Whether the current transaction raised the fast reservation.
    static RAISED_IN_THIS_TRANSACTION: Cell<bool> = const { Cell::new(false) };
    /// Whether the current transaction granted a fast lease.
    static FAST_GRANT_IN_THIS_TRANSACTION: Cell<bool> = const { Cell::new(false) };
}

/// The lowest fence a grant at clock reading `now` (µs since PostgreSQL's epoch) may get.
pub fn clock_floor(now: i64) -> i64 {
    now.saturating_add(UNIX_TO_POSTGRES_EPOCH)
}

/// The lowest fence any grant of a key at `now` may get, besides its own row's fence + 1: above the
/// clock, the other kind's last fence (`other_fence`), every deleted row's (by the sweep, or freed
/// by a grant that needed room), and every fast fence a reset may have forgotten. Read after the
/// key's rows, so that a row found missing was deleted by a sweep whose raise of the high-water
/// mark has committed too.
pub fn floor(now: i64, other_fence: Option<i64>) -> i64 {
    let above = |fence: Option<i64>| fence.map_or(i64::MIN, |fence| fence.saturating_add(1));
    clock_floor(now)
        .max(above(other_fence))
        .max(above(super::high_water::get()))
        .max(above(super::memory::shared::freed_floor()))
        .max(reset_floor(now))
}

/// Above every fast fence a reset may have forgotten, as this backend found at its first grant (see
/// the module's comment).
fn reset_floor(now: i64) -> i64 {
    let Some(table) = installed::table(c"fast_reserve") else { return i64::MIN };
    if let Some((_, floor)) = RESET_FLOOR.get().filter(|(read_from, _)| *read_from == table) {
        return floor;
    }
    let marker = marker_owner();
    let floor = execute_first::<i64>(MARKED_FLOOR, &[marker.clone().into()])
        .unwrap_or_else(|| after_a_reset(now, marker));
    RESET_FLOOR.set(Some((table, floor)));
    floor
}

/// The reset marker's owner: which store of fast leases it speaks for. A marker of another (fast
/// leases in the table before a start with them in shared memory, or an earlier shared memory) is
/// one a reset has passed since.
fn marker_owner() -> String {
    match super::memory::changes::generation() {
        Some(generation) => format!("pg_fence: reset floor, shared memory {generation:016x}"),
        None => "pg_fence: reset floor, unlogged table".to_string(),
    }
}

/// The first grant since the fast leases were last forgotten: above the reservation, once the
/// clock has passed it (so that fences stay at the clock), unless it is further ahead than any
/// raise reaches, which only a step back of the clock makes. Writes the floor in the marker.
fn after_a_reset(now: i64, marker: String) -> i64 {
    let above_reserved = reserved().map_or(i64::MIN, |reserved| reserved.saturating_add(1));
    if above_reserved.saturating_sub(clock_floor(now)) <= WAIT_AT_MOST {
        loop {
            let ahead = above_reserved.saturating_sub(clock_floor(crate::pg::clock::now()));
            if ahead <= 0 {
                break;
            }
            crate::pg::latch::sleep(ahead);
        }
    }
    // The marker's rows stay locked until this transaction ends: one transaction at a time writes
    // it (the others skip the lock, and do not wait for those rows), and only under READ COMMITTED
    // (where a marker deleted meanwhile is no conflict). Until a marker is there, a backend reads
    // its floor from the reservation.
    let gate = keylock::tag(keylock::RESET_MARKER_CLASS, 0);
    // SAFETY: reads the backend's transaction state.
    let read_committed = unsafe { pg_sys::XactIsoLevel } < pg_sys::XACT_REPEATABLE_READ as i32;
    if read_committed && keylock::acquire(&gate, pg_sys::ExclusiveLock as i32, Owner::TopTransaction, true) {
        execute(UNMARK_OTHER_STORE, &[marker.clone().into()], |_| ());
        if super::memory::changes::in_use() {
            // The table's fast leases, unused while they are in shared memory, would come back to
            // life if fast leases went back to the table; their fences are below this floor.
            execute("DELETE FROM fence.fast_lease_state WHERE key <> ''", &[], |_| ());
        }
        execute(MARK_RESET, &[above_reserved.into(), marker.into()], |_| ());
    }
    above_reserved
}

/// The floor the reset marker holds, if it speaks for the current store ($1).
const MARKED_FLOOR: &str = "SELECT fence FROM fence.fast_lease_state WHERE key = '' AND owner = $1";

/// A marker of another store (or of an earlier shared memory) goes before this one's is written.
const UNMARK_OTHER_STORE: &str = "DELETE FROM fence.fast_lease_state WHERE key = '' AND owner <> $1";

/// A row of the unlogged table under the empty key, which no lease can have: PostgreSQL empties the
/// table after a crash or an immediate shutdown, and a promoted standby starts with it empty, so
/// the row is there exactly while no fast fence can have been forgotten since it was written. The
/// sweep leaves it alone. Two first grants at once each read a floor above the same reservation
/// (neither sees the other's raises, which commit with its marker): the first marker stays. (Only
/// columns every version's table has: 0.4.0's has no slot.)
const MARK_RESET: &str = "
    INSERT INTO fence.fast_lease_state (key, fence, owner, acquired_at, expires_at)
    VALUES ('', $1, $2, pg_catalog.clock_timestamp(), pg_catalog.clock_timestamp())
    ON CONFLICT DO NOTHING";

/// The fast reservation, as this statement sees it committed.
fn reserved() -> Option<i64> {
    execute_first::<i64>("SELECT max(fence) FROM fence.fast_reserve", &[])
}

/// Before fast fence `fence` (granted at `now`) is told: makes sure the fast reservation covers it,
/// raising it and making this commit flush when it does not. Nearly every call finds it covered.
pub fn reserve_fast_fence(fence: i64, now: i64) {
    let Some(table) = installed::table(c"fast_reserve") else { return };
    refuse_prepare_after_a_fast_grant();
    let covered = |known: Option<(pg_sys::Oid, i64)>| known.is_some_and(|(t, r)| t == table && fence <= r);
    if covered(KNOWN_RESERVED.get()) {
        return;
    }
    if let Some(reserved) = reserved().filter(|reserved| fence <= *reserved) {
        // What this statement reads is committed, and so flushed, unless this transaction raised it
        // itself: a raise that a rollback (of a savepoint, say) may still undo covers nothing.
        if !RAISED_IN_THIS_TRANSACTION.get() {
            KNOWN_RESERVED.set(Some((table, reserved)));
        }
        return;
    }
    // A row per raise, never an update of one row: a raise waits for no other raiser's transaction.
    let raised = fence.max(clock_floor(now).saturating_add(RESERVE_AHEAD));
    execute("INSERT INTO fence.fast_reserve (fence) VALUES ($1)", &[raised.into()], |_| ());
    durability::require_durable_commit();
    if !RAISED_IN_THIS_TRANSACTION.replace(true) {
        for end in [PgXactCallbackEvent::Commit, PgXactCallbackEvent::Abort, PgXactCallbackEvent::Prepare] {
            register_xact_callback(end, || RAISED_IN_THIS_TRANSACTION.set(false));
        }
    }
}

/// A prepared transaction outlives a crash that a fast lease does not, and its raise of the
/// reservation is not read by the backends that start after the crash (it is not committed): once
/// committed, its fast fence could be above their floor. Two-phase commit and fast leases do not mix.
fn refuse_prepare_after_a_fast_grant() {
    if !FAST_GRANT_IN_THIS_TRANSACTION.replace(true) {
        register_xact_callback(PgXactCallbackEvent::PrePrepare, || {
            FAST_GRANT_IN_THIS_TRANSACTION.set(false);
            crate::pg::errors::prepare_after_fast_grant();
        });
        for end in [PgXactCallbackEvent::Commit, PgXactCallbackEvent::Abort] {
            register_xact_callback(end, || FAST_GRANT_IN_THIS_TRANSACTION.set(false));
        }
    }
}

/// `floor` reads the high-water mark as last committed, but a sweep may delete the key's row after
/// that read and before the grant's INSERT, whose own read of the mark (`above_deleted!`) then sees,
/// under REPEATABLE READ or SERIALIZABLE, only its snapshot's. Once the INSERT is done, every sweep
/// that deleted an older row of the key has committed (the INSERT waited for it), so the latest
/// committed mark tells. Such a grant fails with 40001 rather than issue a fence twice.
pub fn check_first_grant(fence: i64) {
    // SAFETY: reads the backend's transaction state.
    if unsafe { pg_sys::XactIsoLevel } < pg_sys::XACT_REPEATABLE_READ as i32 {
        return; // READ COMMITTED: the INSERT's own snapshot is taken after such a sweep committed
    }
    if super::high_water::get().is_some_and(|mark| mark >= fence) {
        crate::pg::errors::deleted_since_snapshot();
    }
}
