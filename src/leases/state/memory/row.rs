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
    /// (pid, session lock id) of a session-bound lease (see `line::sessions`).
    pub session: Option<(i32, i64)>,
    /// The owner whose waiting acquire is to claim it (see `calls::handoff`); u16::MAX long for none.
    handed_to_len: u16,
    handed_to: [u8; MAX_OWNER_BYTES],
    /// The extension's objects the row belongs to (see `write_set`): rows left by a dropped
    /// pg_fence are no one's.
    pub incarnation: u32,
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
            handed_to_len: u16::MAX,
            handed_to: [0; MAX_OWNER_BYTES],
            incarnation: 0,
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
        self.owner_len = copy_text(&mut self.owner, owner);
    }

    pub fn handed_to(&self) -> Option<&str> {
        (self.handed_to_len != u16::MAX)
            .then(|| std::str::from_utf8(&self.handed_to[..self.handed_to_len as usize]).unwrap_or_default())
    }

    pub fn set_handed_to(&mut self, handed_to: Option<&str>) {
        self.handed_to_len = handed_to.map_or(u16::MAX, |text| copy_text(&mut self.handed_to, text));
    }
}

/// Copies `text` into `into` (at most its length, on a character boundary); the length copied.
fn copy_text(into: &mut [u8; MAX_OWNER_BYTES], text: &str) -> u16 {
    let len = text.len().min(MAX_OWNER_BYTES);
    let len = (0..=len).rev().find(|&at| text.is_char_boundary(at)).unwrap_or(0);
    into[..len].copy_from_slice(&text.as_bytes()[..len]);
    len as u16
}

impl Ended {
    pub fn reason(&self) -> &'static str {
        REASONS.get(self.reason as usize).copied().unwrap_or("unknown")
    }

    pub fn reason_index(reason: &str) -> u8 {
        REASONS.iter().position(|each| *each == reason).unwrap_or(REASONS.len()) as u8
    }
}
