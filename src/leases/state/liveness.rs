//! What makes a lease live, as one SQL condition that every statement deciding it shares (and the
//! view fence.leases repeats): not released, not expired at the clock reading passed in, and, for a
//! session-bound lease, its session still connected (see `line::sessions`). The guard, which runs no
//! statement, applies the same rule in Rust (`table_rows`, `memory`); a #[pg_test] checks that the two agree.

/// `live_at!("$3")`: the lease in the row of fence.lease_state is live at the timestamptz `$3`.
/// Never NULL, so `NOT live_at!(..)` means "dead", even for a row edited by hand.
macro_rules! live_at {
    ($now:literal) => {
        concat!(
            "(token_hash IS NOT NULL AND expires_at > ",
            $now,
            " AND (session_id IS NULL OR coalesce(fence.holder_alive(session_pid, session_id), false)))"
        )
    };
}
