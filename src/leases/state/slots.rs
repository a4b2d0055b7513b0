//! Where a grant goes among a key's rows (see `mode`): the slot it takes, and the guard locks whose
//! writers it waits for before it commits (invariant 3, see `locks::keylock`).
use super::found::Found;
use super::mode::LeaseMode;
use crate::locks::keylock::{self, GuardLock};
use std::time::Instant;

/// The slot a grant in `mode` would take first, given the key's rows: None while the live holders
/// leave no room for it.
pub fn slot_for(mode: LeaseMode, rows: &[Found]) -> Option<i32> {
    free_slots(mode, rows).first().copied()
}

/// The slots a grant in `mode` may take, given the key's rows, in the order it tries them: none
/// while the live holders leave no room for it. A shared grant's is one: it waits for no writer of
/// its own slot, so any free slot would do.
fn free_slots(mode: LeaseMode, rows: &[Found]) -> Vec<i32> {
    let live: Vec<&Found> = rows.iter().filter(|row| row.live.is_some()).collect();
    if live.iter().any(|row| row.mode.shared != mode.shared) {
        return Vec::new();
    }
    let free = |slot: &i32| !live.iter().any(|row| row.slot == *slot);
    if mode.shared {
        // The first slot no live holder uses: an ended holder's row is taken over.
        return (0..).find(free).into_iter().collect();
    }
    let limit = live.iter().map(|row| row.mode.permits).fold(mode.permits, i32::min);
    if live.len() >= limit as usize {
        return Vec::new();
    }
    (0..mode.permits).filter(free).collect()
}

/// With the key lock held: the slot a grant in `mode` takes and the guard locks it took for it (see
/// `locks_to_wait_for`), kept to the transaction's end. The first free slot whose writers are all
/// done at once; else the first free slot, waiting for its writers until `deadline` (None: not at
/// all). So a writer frozen in its transaction under an ended permit holds back the grant of that
/// permit's slot only, never a grant that another free slot leaves room for. None, holding none of
/// the guard locks, when no slot is free or its writers are not done in time. The locks of other
/// modes' ended holders, which every slot needs, are tried once: a slot is tried for its own lock
/// only, so the tries end at the first slot no writer holds. A set takes its guard locks first and
/// grants after, in one slot (its keys are exclusive).
pub fn take_slot(
    key: &str,
    mode: LeaseMode,
    rows: &[Found],
    deadline: Option<Instant>,
) -> Option<(i32, Vec<GuardLock>)> {
    let free = free_slots(mode, rows);
    let first = *free.first()?;
    let common = other_modes_locks(mode, rows);
    if keylock::lock_guards_for_grant(key, &common, None) {
        for slot in free {
            let locks = locks_to_wait_for(mode, slot, rows);
            let own: Vec<GuardLock> = locks.iter().filter(|lock| !common.contains(lock)).copied().collect();
            if keylock::lock_guards_for_grant(key, &own, None) {
                return Some((slot, locks));
            }
        }
        keylock::unlock_guards_for_grant(key, &common);
    }
    let locks = locks_to_wait_for(mode, first, rows);
    keylock::lock_guards_for_grant(key, &locks, Some(deadline?)).then_some((first, locks))
}

/// The locks whose writers a grant into `slot` waits for: the slot's own, and those of every
/// ended holder of another mode (`other_modes_locks`). Sorted, so that every grant takes them in
/// the same order. Not slot 0's for an exclusive grant: that is the key lock, which it holds in
/// `Grant` mode already.
fn locks_to_wait_for(mode: LeaseMode, slot: i32, rows: &[Found]) -> Vec<GuardLock> {
    let mut locks = other_modes_locks(mode, rows);
    let the_key_lock = mode.is_exclusive() && slot == 0;
    if !mode.shared && !the_key_lock {
        locks.push(GuardLock::Slot(slot));
    }
    locks.sort();
    locks.dedup();
    locks
}

/// The guard locks of the key's ended holders of another mode than `mode`: a grant in any slot
/// waits for their writers (each needs the mode it was granted under to have ended with its
/// writes). Sorted; never slot 0's for an exclusive grant (see `locks_to_wait_for`).
fn other_modes_locks(mode: LeaseMode, rows: &[Found]) -> Vec<GuardLock> {
    let mut locks: Vec<GuardLock> = rows
        .iter()
        .filter(|row| row.live.is_none() && row.mode != mode)
        .map(|row| row.mode.guard_lock(row.slot))
        .collect();
    if mode.is_exclusive() {
        locks.retain(|lock| *lock != GuardLock::Slot(0));
    }
    locks.sort();
    locks.dedup();
    locks
}

/// Whether no writer under the ended lease of `slot`, granted in `mode`, still holds its guard
/// lock, so that the row may go (deleted by the sweep, or freed from shared memory). While the
/// row is there, the key's next grant of another mode waits for those writers' transactions
/// (`locks_to_wait_for`); without it, the grant would not. A writer cannot take the lock afresh: its
/// guard finds the lease ended (as last committed) and refuses. So the lock, taken as a grant
/// takes it, is given back at once. Not for a transaction that holds the lock itself: its own
/// locks never stop it.
pub fn writers_done(key: &str, mode: LeaseMode, slot: i32) -> bool {
    let guard = [mode.guard_lock(slot)];
    let done = keylock::lock_guards_for_grant(key, &guard, None);
    if done {
        keylock::unlock_guards_for_grant(key, &guard);
    }
    done
}
