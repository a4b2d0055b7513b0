//! The rows charged to each role, in use or reserved (see `shared`): no role may have more than
//! pg_fence.fast_leases_per_role, so that one role cannot take the table from the others, nor one
//! database from the rest of the cluster. A transaction reserves a row for each (key, slot) it is
//! to add when it makes the change (`reserve`), so that applying its changes at commit cannot run
//! out of rows: a full table refuses the change then, with an error, and nothing is half made.
use super::layout::{position, table, with_lock, Charge, Header, Place, NONE, ROLES};
use pgrx::pg_sys;
use std::sync::atomic::Ordering;

/// The role `key`'s row of `slot` is charged to; None when the table has no such row.
pub fn charged_role(place: Place, key: &str, slot: i32) -> Option<u32> {
    let table = table()?;
    let bucket = table.bucket(place);
    with_lock(table.lock_of(bucket), pg_sys::LWLockMode::LW_SHARED, || {
        let (_, at) = position(&table, bucket, place, key, slot);
        // SAFETY: the cell found, under its bucket's lock.
        (at != NONE).then(|| unsafe { (*table.cell(at)).role })
    })
}

/// Charges one more row to `role`, for a row it takes over from another role at commit
/// (`recharge`); no room is needed, the row exists.
pub fn charge(role: u32) -> Result<(), NoRoom> {
    let Some(table) = table() else { return Err(NoRoom::Full) };
    with_lock(table.free_list_lock(), pg_sys::LWLockMode::LW_EXCLUSIVE, || {
        charge_within_limit(table.header, role)
    })
}

/// Gives back a `charge` that no row took.
pub fn uncharge_role(role: u32) {
    if let Some(table) = table() {
        with_lock(table.free_list_lock(), pg_sys::LWLockMode::LW_EXCLUSIVE, || uncharge(table.header, role));
    }
}

/// At commit: `key`'s row of `slot` is charged to `role` (charged already) instead of the role it
/// was charged to.
pub fn recharge(place: Place, key: &str, slot: i32, role: u32) {
    let Some(table) = table() else { return };
    let bucket = table.bucket(place);
    let before = with_lock(table.lock_of(bucket), pg_sys::LWLockMode::LW_EXCLUSIVE, || {
        let (_, at) = position(&table, bucket, place, key, slot);
        // SAFETY: the cell found, under its bucket's lock.
        (at != NONE).then(|| unsafe { std::mem::replace(&mut (*table.cell(at)).role, role) })
    });
    // The row's old role gives up its charge; with no row, the new role does.
    with_lock(table.free_list_lock(), pg_sys::LWLockMode::LW_EXCLUSIVE, || {
        uncharge(table.header, before.unwrap_or(role))
    });
}

/// Why a row could not be reserved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoRoom {
    /// Every row of the table is in use or reserved.
    Full,
    /// The role has pg_fence.fast_leases_per_role rows (or ROLES other roles have rows).
    RoleLimit,
}

/// Reserves a row, charged to `role`, for a change to be applied at commit.
pub fn reserve(role: u32) -> Result<(), NoRoom> {
    let Some(table) = table() else { return Err(NoRoom::Full) };
    let header = table.header;
    with_lock(table.free_list_lock(), pg_sys::LWLockMode::LW_EXCLUSIVE, || {
        let used = header.used.load(Ordering::Acquire) + header.reserved.load(Ordering::Acquire);
        if used >= header.capacity {
            return Err(NoRoom::Full);
        }
        charge_within_limit(header, role)?;
        header.reserved.fetch_add(1, Ordering::AcqRel);
        Ok(())
    })
}

/// Gives back a reservation of `role`'s that no change used.
pub fn unreserve(role: u32) {
    if let Some(table) = table() {
        with_lock(table.free_list_lock(), pg_sys::LWLockMode::LW_EXCLUSIVE, || {
            uncharge(table.header, role);
            table.header.reserved.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

/// `role`'s entry of the charges, taking a free one if `take` (under the free list's lock).
fn charge_of(header: &Header, role: u32, take: bool) -> Option<&Charge> {
    let start = (role as usize).wrapping_mul(0x9E37_79B9) % ROLES;
    let mut free = None;
    for i in 0..ROLES {
        let charge = &header.roles[(start + i) % ROLES];
        let held_by = charge.role.load(Ordering::Relaxed);
        if held_by == role && role != 0 {
            return Some(charge);
        }
        if charge.rows.load(Ordering::Relaxed) == 0 && free.is_none() {
            free = Some(charge);
        }
        if held_by == 0 {
            break; // never used: the role has no entry further on
        }
    }
    let charge = free.filter(|_| take)?;
    charge.role.store(role, Ordering::Relaxed);
    Some(charge)
}

/// One more row charged to `role`, unless it has pg_fence.fast_leases_per_role (under the free
/// list's lock).
fn charge_within_limit(header: &Header, role: u32) -> Result<(), NoRoom> {
    let charge = charge_of(header, role, true).ok_or(NoRoom::RoleLimit)?;
    if charge.rows.load(Ordering::Relaxed) >= crate::pg::settings::fast_leases_per_role() {
        return Err(NoRoom::RoleLimit);
    }
    charge.rows.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

pub(super) fn uncharge(header: &Header, role: u32) {
    if let Some(charge) = charge_of(header, role, false) {
        let rows = charge.rows.load(Ordering::Relaxed);
        charge.rows.store(rows.saturating_sub(1), Ordering::Relaxed);
    }
}
