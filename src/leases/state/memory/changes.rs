//! The changes the lease calls make to a fast lease's row, on rows in shared memory: each the
//! counterpart of one statement over fence.fast_lease_state, deciding liveness by the same rule
//! (`live_at!`, src/leases/state/liveness.rs) and recording ends as `ended` does. The caller holds the
//! key's lock, as for the statements.
use super::charges::NoRoom;
use super::row::{Ended, Row};
use super::write_set;
use crate::leases::state::found::{self as lease_row, Found, Live};
use crate::leases::state::kinds::Kind;
use crate::leases::state::mode::LeaseMode;
use crate::leases::state::session_lock;
use crate::leases::state::slots;
use crate::locks::{keylock, sweeps};
use crate::pg::{errors, settings};
use pgrx::pg_sys;

/// Whether fast leases live in shared memory here: pg_fence preloaded with pg_fence.fast_leases
/// above 0, and not on a standby (which has no fast leases, and refuses to grant them).
pub fn in_use() -> bool {
    // SAFETY: reads shared recovery state.
    super::shared::usage().is_some_and(|(_, capacity, _)| capacity > 0)
        && !unsafe { pg_sys::RecoveryInProgress() }
        && incarnation() != 0
}

/// The extension's objects this backend works with: the OID of its table fence.fast_reserve, which
/// DROP and CREATE EXTENSION make anew. Rows of another are left by a dropped pg_fence.
fn incarnation() -> u32 {
    crate::pg::installed::table(c"fast_reserve").map_or(0, |table| table.to_u32())
}

/// `key`'s rows of this extension, as this transaction sees them.
fn rows(key: &str) -> Vec<Row> {
    let incarnation = incarnation();
    write_set::rows(key).into_iter().filter(|row| row.incarnation == incarnation).collect()
}

/// A change of a row that no lease takes (a renewal, a release, an end, the sweep's).
fn put(key: &str, row: Row) {
    put_charged(key, row, false);
}

/// A change of a row that a lease takes (a grant, a claim): the row is charged to the session's
/// role (see `write_set::put`).
fn put_for_holder(key: &str, row: Row) {
    put_charged(key, row, true);
}

fn put_charged(key: &str, mut row: Row, holder: bool) {
    row.incarnation = incarnation();
    if let Err(no_room) = write_set::put(key, row, holder) {
        free_ended_rows(key, no_room);
        if let Err(no_room) = write_set::put(key, row, holder) {
            match no_room {
                NoRoom::Full => errors::fast_leases_full(super::shared::occupancy()),
                NoRoom::RoleLimit => errors::fast_leases_role_limit(settings::fast_leases_per_role()),
            }
        }
    }
}

/// How many rows a grant that found no room frees at most.
const FREE_AT_ONCE: usize = 256;

/// A grant of `granting` found no room (the table full, or the role at its limit): frees at once the
/// rows of this database whose leases ended, whose lock-delays ran out and under which no writer's
/// transaction is still open (for the role's limit, the role's own), as a sweep with
/// pg_fence.retain_ended = 0 would, but outside the transaction: their fences go into a floor in
/// shared memory first, which every later grant starts above (see `fences`), and `lease_status` no
/// longer knows how they ended. Keys another transaction is changing, or this one changed, are
/// left alone; so is a row whose writer under the ended lease still holds its guard lock, which
/// the key's next grant must wait for (see `slots`).
fn free_ended_rows(granting: &str, no_room: NoRoom) {
    let now = crate::pg::clock::now();
    let incarnation = incarnation();
    let role = (no_room == NoRoom::RoleLimit).then(write_set::session_role);
    let candidates = super::shared::rows_charged(role, FREE_AT_ONCE, |key, row| {
        !key.is_empty() && key != granting && can_be_freed(row, now, incarnation)
    });
    for (key, candidate) in candidates {
        // A key this transaction holds a lock of (a guard under the ended lease, say) is left
        // alone: its own locks never stop it, and the row may be what keeps the next grant waiting.
        if write_set::changes_key(&key) || keylock::held_by_me(&key) || !sweeps::try_lock_to_sweep(&key) {
            continue;
        }
        // Under the key's lock nobody else changes its rows: is this one still to be freed?
        let row = super::shared::Place::of(&key).and_then(|place| {
            let row = super::shared::rows(place, &key).into_iter().find(|row| row.slot == candidate.slot)?;
            Some((place, row))
        });
        if let Some((place, row)) = row.filter(|(_, row)| can_be_freed(row, now, incarnation)) {
            let mode = LeaseMode { shared: row.shared, permits: row.permits };
            if !keylock::guard_held_by_me(&key, mode.guard_lock(row.slot))
                && slots::writers_done(&key, mode, row.slot)
            {
                super::shared::free_now(place, &key, row.slot, row.fence);
            }
        }
        sweeps::unlock_swept(&key);
    }
}

/// A row left by a dropped pg_fence, or one whose lease ended and whose lock-delay has run out.
fn can_be_freed(row: &Row, now: i64, incarnation: u32) -> bool {
    row.incarnation != incarnation
        || (!live_at(row, now)
            && (row.lock_delay == 0 || row.expires_at.min(now).saturating_add(row.lock_delay) < now))
}

/// The generation of the shared memory fast leases live in (see `fences`): a server start or crash
/// restart makes it anew. None when they are not in shared memory.
pub fn generation() -> Option<u64> {
    if in_use() {
        super::shared::generation()
    } else {
        None
    }
}

fn database() -> u32 {
    // SAFETY: set for the life of a backend connected to a database.
    unsafe { pg_sys::MyDatabaseId }.to_u32()
}

/// `live_at!` on a row.
fn live_at(row: &Row, now: i64) -> bool {
    row.token_hash.is_some()
        && row.expires_at > now
        && row.session.is_none_or(|(pid, id)| session_lock::alive(pid, id))
}

/// `involuntary_end!`: why an unreleased lease found dead at `now` ended.
fn involuntary_end(row: &Row, now: i64) -> &'static str {
    if row.expires_at > now {
        "session_ended"
    } else {
        "expired"
    }
}

/// `record_end!`: the row's lease, as it is, recorded as ended at `at` for `reason`.
fn record_end(row: &mut Row, reason: &str, at: i64) {
    if let Some(token_hash) = row.token_hash {
        row.ended = Some(Ended { token_hash, fence: row.fence, at, reason: Ended::reason_index(reason) });
    }
}

/// `key`'s rows as `row::find` reads a table's, for this transaction.
pub fn found(key: &str, now: i64, ends: bool) -> Vec<Found> {
    rows(key).iter().map(|row| found_of(row, now, ends)).collect()
}

/// One row, as `found` reads it.
pub fn found_one(row: &Row, now: i64) -> Found {
    found_of(row, now, false)
}

fn found_of(row: &Row, now: i64, ends: bool) -> Found {
    let unreleased = row.token_hash.is_some();
    let session_alive = row
        .session
        .filter(|_| unreleased && row.expires_at > now)
        .map(|(pid, id)| session_lock::alive(pid, id));
    let mode = LeaseMode { shared: row.shared, permits: row.permits };
    let live = (unreleased && row.expires_at > now && session_alive != Some(false)).then(|| Live {
        kind: Kind::Fast,
        fence: row.fence,
        slot: row.slot,
        mode,
        expires_at: row.expires_at,
        token_hash: row.token_hash.map(|hash| hash.to_vec()).unwrap_or_default(),
        owner: row.owner().to_owned(),
        acquired_at: row.acquired_at,
        session: row.session,
        handed_to: row.handed_to().map(str::to_owned),
    });
    let ended = row.ended.filter(|_| ends || row.lock_delay > 0).map(|ended| lease_row::Ended {
        token_hash: ended.token_hash.to_vec(),
        fence: ended.fence,
        at: ended.at,
        reason: ended.reason().to_owned(),
    });
    Found {
        kind: Kind::Fast,
        slot: row.slot,
        mode,
        fence: row.fence,
        live,
        unreleased,
        token_hash: row.token_hash.map(|hash| hash.to_vec()),
        expires_at: row.expires_at,
        session_gone: session_alive == Some(false),
        ended,
        lock_delay: row.lock_delay,
    }
}

/// What a grant puts in the row.
pub struct Grant<'a> {
    pub slot: i32,
    pub owner: &'a str,
    pub token_hash: [u8; 32],
    pub acquired_at: i64,
    pub expires_at: i64,
    pub session: Option<(i32, i64)>,
    pub mode: LeaseMode,
    pub handed_to: Option<&'a str>,
    pub lock_delay: i64,
}

/// `grant_again!` and `grant_first!`: grants the slot unless its lease is live at `acquired_at`,
/// with a fence of at least `floor` (and above the slot's own); the new fence.
pub fn grant(key: &str, grant: &Grant, floor: i64) -> Option<i64> {
    let now = grant.acquired_at;
    let old = rows(key).into_iter().find(|row| row.slot == grant.slot);
    let mut row = match old {
        Some(row) if live_at(&row, now) => return None,
        Some(mut row) => {
            if row.token_hash.is_some() {
                let reason = involuntary_end(&row, now);
                let at = row.expires_at.min(now);
                record_end(&mut row, reason, at);
            }
            row.fence = row.fence.saturating_add(1).max(floor);
            row
        }
        None => Row::new(grant.slot, floor, ""),
    };
    row.set_owner(grant.owner);
    row.token_hash = Some(grant.token_hash);
    row.acquired_at = now;
    row.expires_at = grant.expires_at;
    row.session = grant.session;
    row.shared = grant.mode.shared;
    row.permits = grant.mode.permits;
    row.set_handed_to(grant.handed_to);
    row.lock_delay = grant.lock_delay;
    put_for_holder(key, row);
    Some(row.fence)
}

/// `end_unreleased!`: the key's rows whose leases ended without a release, ended for good.
pub fn end_unreleased(key: &str, now: i64) {
    for mut row in rows(key) {
        if row.token_hash.is_some() && !live_at(&row, now) {
            let reason = involuntary_end(&row, now);
            let at = row.expires_at.min(now);
            record_end(&mut row, reason, at);
            row.token_hash = None;
            row.expires_at = row.expires_at.min(now);
            put(key, row);
        }
    }
}

/// The live row the token with this hash holds at `now`.
fn held(key: &str, token_hash: &[u8], now: i64) -> Option<Row> {
    rows(key)
        .into_iter()
        .find(|row| row.token_hash.is_some_and(|hash| hash == token_hash) && live_at(row, now))
}

/// `renew!`: the new expiry.
pub fn renew(key: &str, token_hash: &[u8], now: i64, expires_at: i64) -> Option<i64> {
    let mut row = held(key, token_hash, now)?;
    row.expires_at = expires_at;
    put(key, row);
    Some(expires_at)
}

/// `release!`: the ended lease's fence.
pub fn release(key: &str, token_hash: &[u8], now: i64) -> Option<i64> {
    let mut row = held(key, token_hash, now)?;
    record_end(&mut row, "released", now);
    row.token_hash = None;
    row.expires_at = now;
    put(key, row);
    Some(row.fence)
}

/// `proclaim!`: the lease's fence.
pub fn proclaim(key: &str, token_hash: &[u8], owner: &str, now: i64) -> Option<i64> {
    let mut row = held(key, token_hash, now)?;
    row.set_owner(owner);
    put(key, row);
    Some(row.fence)
}

/// `revoke!`: the fences of the leases it ended.
pub fn revoke(key: &str, now: i64) -> Vec<i64> {
    let mut revoked = Vec::new();
    for mut row in rows(key).into_iter().filter(|row| live_at(row, now)) {
        record_end(&mut row, "revoked", now);
        row.token_hash = None;
        row.expires_at = now;
        put(key, row);
        revoked.push(row.fence);
    }
    revoked
}

/// `lift_lock_delay!`: no lock-delay on the key's rows whose leases are not live (see `revoke`).
pub fn lift_lock_delay(key: &str, now: i64) {
    for mut row in rows(key).into_iter().filter(|row| row.lock_delay > 0 && !live_at(row, now)) {
        row.lock_delay = 0;
        put(key, row);
    }
}

/// What a claim of a handed lease puts in the row (see `calls::handoff`).
pub struct Claim<'a> {
    pub slot: i32,
    pub handed_to: &'a str,
    pub token_hash: [u8; 32],
    pub expires_at: i64,
    pub session: Option<(i32, i64)>,
    pub lock_delay: i64,
}

/// `claim!`: the claimed lease's (owner, fence, acquired_at, expires_at).
pub fn claim(key: &str, claim: &Claim, now: i64) -> Option<(String, i64, i64, i64)> {
    let mut row = rows(key).into_iter().find(|row| {
        row.slot == claim.slot && row.handed_to() == Some(claim.handed_to) && live_at(row, now)
    })?;
    row.token_hash = Some(claim.token_hash);
    row.set_handed_to(None);
    row.expires_at = claim.expires_at;
    row.session = claim.session;
    row.lock_delay = claim.lock_delay;
    put_for_holder(key, row);
    Some((row.owner().to_owned(), row.fence, row.acquired_at, row.expires_at))
}

/// The key's last fence in shared memory, as this transaction sees it.
pub fn last_fence(key: &str) -> Option<i64> {
    rows(key).iter().map(|row| row.fence).max()
}

/// Every lease row of this extension in shared memory, for the view fence.leases: (key, row).
pub fn all_rows() -> Vec<(String, Row)> {
    let incarnation = incarnation();
    let mut all = Vec::new();
    let mut from = 0;
    loop {
        from = super::shared::each_row(from, 4096, |key, row| {
            if row.incarnation == incarnation && !key.is_empty() {
                all.push((key.to_owned(), *row));
            }
        });
        if from == 0 {
            return all;
        }
    }
}

/// What a sweep of shared memory changes: each row's (key, slot), and whether it deletes it.
pub struct SweepCandidate {
    pub key: String,
    pub slot: i32,
}

/// Up to `limit` rows to tidy among the buckets from `from` on: leases ended without a release by
/// `now`, and rows of leases that ended before `delete_before` (their lock-delays run out) or left
/// by a dropped pg_fence. Returns them, and where to go on.
pub fn sweep_candidates(
    from: usize,
    limit: usize,
    now: i64,
    delete_before: Option<i64>,
) -> (Vec<SweepCandidate>, usize) {
    let incarnation = incarnation();
    let here = database();
    let mut found = Vec::new();
    // The rows of dropped databases, which nobody else can sweep, are deleted on the way. (Other
    // databases' rows are only collected under the table's locks, and looked up after.)
    let mut others: Vec<(u32, String, i32)> = Vec::new();
    let mut at = from;
    while found.len() < limit && others.len() < limit {
        at = super::shared::each_row_of_every_database(at, 1024, |database, key, row| {
            if database != here {
                others.push((database, key.to_owned(), row.slot));
                return;
            }
            let stale = row.incarnation != incarnation;
            let ended_unreleased = row.token_hash.is_some() && !live_at(row, now);
            let long_ended = row.token_hash.is_none()
                && delete_before.is_some_and(|before| row.expires_at < before)
                && (row.lock_delay == 0 || row.expires_at + row.lock_delay < now);
            if !key.is_empty() && (stale || ended_unreleased || long_ended) {
                found.push(SweepCandidate { key: key.to_owned(), slot: row.slot });
            }
        });
        if at == 0 {
            break;
        }
    }
    let mut known: Vec<(u32, bool)> = Vec::new();
    for (database, key, slot) in others {
        let exists = match known.iter().find(|(each, _)| *each == database) {
            Some((_, exists)) => *exists,
            None => {
                let exists = super::shared::database_exists(database);
                known.push((database, exists));
                exists
            }
        };
        if !exists {
            super::shared::delete_of_dropped_database(database, &key, slot);
        }
    }
    (found, at)
}

/// Sweeps one candidate, under the key's lock: (fence, deleted), or None when it no longer is one.
pub fn sweep(candidate: &SweepCandidate, now: i64, delete_before: Option<i64>) -> Option<(i64, bool)> {
    let incarnation = incarnation();
    let key = &candidate.key;
    let row = write_set::rows(key).into_iter().find(|row| row.slot == candidate.slot)?;
    if row.incarnation != incarnation
        || (row.token_hash.is_none()
            && delete_before.is_some_and(|before| row.expires_at < before)
            && (row.lock_delay == 0 || row.expires_at + row.lock_delay < now)
            && slots::writers_done(key, LeaseMode { shared: row.shared, permits: row.permits }, row.slot))
    {
        write_set::delete(key, row.slot);
        return Some((row.fence, true));
    }
    if row.token_hash.is_some() && !live_at(&row, now) {
        let mut ended = row;
        let at = ended.expires_at.min(now);
        let reason = involuntary_end(&ended, now);
        record_end(&mut ended, reason, at);
        ended.token_hash = None;
        ended.expires_at = at;
        put(key, ended);
        return Some((ended.fence, false));
    }
    None
}
