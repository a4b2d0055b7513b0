//! A fast lease's row as shared memory keeps it: the columns of the table fence.fast_lease_state,
//! fixed in size, so that a row is copied whole and never points anywhere.
use crate::pg::input::MAX_OWNER_BYTES;

/// Why a recorded lease ended (see `ended`), as the table's text column spells it.
pub const REASONS: [&str; 5] = ["released", "expired", "revoked", "session_ended", "taken_over"];

#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct Row {
    pub slot: i32,
    pub shared: bool,
    pub permits: i32,
    pub fence: i64,
    owner_len: u16,
    owner: [u8; MAX_OWNER_BYTES],
    /// SHA-256 of the holder's token; None once released or ended for good.
    pub token_hash: Option<[u8; 32]>,
    pub acquired_at: i64,
    pub expires_at: i64,
    /// (pid, session lock id) of a session-bound lease (see `sessions`).
    pub session: Option<(i32, i64)>,
    /// A hash of the owner whose waiting acquire is to claim it (see `handoff`).
    pub handed_to: Option<u64>,
    pub lock_delay: i64,
    pub ended: Option<Ended>,
}

/// The last lease of the row's slot that ended (see `ended`).
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct Ended {
    pub token_hash: [u8; 32],
    pub fence: i64,
    pub at: i64,
    /// An index into REASONS.
    pub reason: u8,
}

impl Row {
    pub fn new(slot: i32, fence: i64, owner: &str) -> Row {
        let mut row = Row {
            slot,
            shared: false,
            permits: 1,
            fence,
            owner_len: 0,
            owner: [0; MAX_OWNER_BYTES],
            token_hash: None,
            acquired_at: 0,
            expires_at: 0,
            session: None,
            handed_to: None,
            lock_delay: 0,
            ended: None,
        };
        row.set_owner(owner);
        row
    }

    /// The owner; input checks keep it within MAX_OWNER_BYTES.
    pub fn owner(&self) -> &str {
        std::str::from_utf8(&self.owner[..self.owner_len as usize]).unwrap_or_default()
    }

    pub fn set_owner(&mut self, owner: &str) {
        let len = owner.len().min(MAX_OWNER_BYTES);
        let len = (0..=len).rev().find(|&at| owner.is_char_boundary(at)).unwrap_or(0);
        self.owner[..len].copy_from_slice(&owner.as_bytes()[..len]);
        self.owner_len = len as u16;
    }
}

impl Ended {
    pub fn reason(&self) -> &'static str {
        REASONS.get(self.reason as usize).copied().unwrap_or("unknown")
    }

    pub fn reason_index(reason: &str) -> u8 {
        REASONS.iter().position(|each| *each == reason).unwrap_or(REASONS.len()) as u8
    }
}
