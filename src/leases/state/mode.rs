//! How many may hold a key at once: the modes of a lease, and where each grant goes.
//!
//! - exclusive (`permits => 1`, the default): one live lease;
//! - shared (`shared => true`): any number of live shared leases, never beside another mode;
//! - a semaphore (`permits => N`): at most N live leases of the key.
//!
//! Every holder of a key has a row of its own, in a slot of the key (the primary key is (key, slot));
//! slot 0 is where an exclusive lease lives, so an exclusive key has the one row it always had. A
//! semaphore's holders take slots 0 .. N-1, shared holders any slot. A row keeps the mode its lease
//! was granted under. All holders of a key share one fence sequence: each grant starts above every
//! fence of every row of the key (see `fences`).
//!
//! Callers may disagree about a semaphore's size. A grant under `permits => N` needs fewer live
//! holders than N and than the `permits` of every live holder, so there are never more live holders
//! than the smallest count any of them was granted under. An exclusive lease is a semaphore of one:
//! it needs no live holder at all, and it holds back every semaphore.
//!
//! Invariant 3 (a write under fence F commits before a conflicting grant above F can commit) is
//! kept per holder by locks its guard takes (see `locks::keylock`): an exclusive holder or a
//! semaphore's holder in slot s guards with slot s's lock (slot 0's is the key lock), every shared
//! holder with the key's shared-guard lock. A grant waits for the writers of the holder whose slot it
//! takes, and of every ended holder of another mode: so an exclusive grant waits for every shared
//! writer, while shared grants never wait for each other's writers.
use crate::locks::keylock::GuardLock;
use crate::pg::errors;

/// The most permits a semaphore may have.
pub const MAX_PERMITS: i32 = 10_000;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct LeaseMode {
    pub shared: bool,
    /// How many may hold the key at once; 1 for an exclusive lease (and for a shared one, where it
    /// means nothing).
    pub permits: i32,
}

impl LeaseMode {
    pub const EXCLUSIVE: LeaseMode = LeaseMode { shared: false, permits: 1 };

    /// The mode lease_acquire's `shared` and `permits` ask for; 22023 for a combination that means
    /// nothing.
    pub fn of(shared: bool, permits: i32) -> LeaseMode {
        if !(1..=MAX_PERMITS).contains(&permits) {
            errors::invalid_argument(
                format!("permits must be between 1 and {MAX_PERMITS}, not {permits}"),
                "Pass how many holders the key may have at once: 1 (the default) for an exclusive lease.",
            );
        }
        if shared && permits > 1 {
            errors::invalid_argument(
                "a shared lease cannot have permits".into(),
                "Pass shared => true for a reader's lease (any number at once), or permits => N for a semaphore, not both.",
            );
        }
        LeaseMode { shared, permits }
    }

    pub fn is_exclusive(self) -> bool {
        self == LeaseMode::EXCLUSIVE
    }

    /// The lock this mode's holder in `slot` guards its writes with.
    pub fn guard_lock(self, slot: i32) -> GuardLock {
        if self.shared {
            GuardLock::Shared
        } else {
            GuardLock::Slot(slot)
        }
    }
}
