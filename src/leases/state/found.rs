//! What a read of a key's rows finds, whichever store holds them (the tables, `table_rows`; shared
//! memory, `memory`): a row's last fence, its lease if that is live, and how its last lease ended.
use super::kinds::Kind;
use super::mode::LeaseMode;

/// A live lease, as `live` finds it.
pub struct Live {
    pub kind: Kind,
    pub fence: i64,
    /// Which holder of the key it is, and how it was granted (see `mode`).
    pub slot: i32,
    pub mode: LeaseMode,
    /// When it expires (microseconds, as clock::now()).
    pub expires_at: i64,
    /// SHA-256 of its holder's token.
    pub token_hash: Vec<u8>,
    pub owner: String,
    /// When it was granted (microseconds, as clock::now()).
    pub acquired_at: i64,
    /// For a session-bound lease, its session: (pid, session lock id), see `session_lock`.
    pub session: Option<(i32, i64)>,
    /// The owner whose waiting acquire is to claim it (see `calls::handoff`).
    pub handed_to: Option<String>,
}

/// What one row of a key says at `now`: its last fence, and its lease if that is live.
pub struct Found {
    pub kind: Kind,
    pub slot: i32,
    pub mode: LeaseMode,
    pub fence: i64,
    pub live: Option<Live>,
    /// Whether it still holds a token: live, or ended by expiry or its session without a release.
    pub unreleased: bool,
    /// SHA-256 of the token it still holds, if it does.
    pub token_hash: Option<Vec<u8>>,
    /// When its lease ends or ended (microseconds, as clock::now()).
    pub expires_at: i64,
    /// Whether it is a session-bound lease whose session has ended.
    pub session_gone: bool,
    /// The last lease of this slot that ended, as recorded (see `ended`).
    pub ended: Option<Ended>,
    /// Its lease's lock_delay (µs).
    pub lock_delay: i64,
}

/// A lease's end as its row records it (see `ended`).
pub struct Ended {
    pub token_hash: Vec<u8>,
    pub fence: i64,
    /// When it ended (microseconds, as clock::now()).
    pub at: i64,
    pub reason: String,
}
