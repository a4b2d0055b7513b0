//! The two kinds of lease: durable ones, in the logged table fence.lease_state, and fast ones
//! (`lease_acquire(.., durable => false)`), in the unlogged table fence.fast_lease_state.
//!
//! Both share one key namespace, one key lock and one fence sequence: a grant of either kind takes
//! the key's lock, finds no live lease of the other kind, and starts above the other kind's fence.
//! A fast lease's changes write no WAL but their commit record, so its grant waits for no flush;
//! PostgreSQL empties an unlogged table after a crash, and a standby has none of its rows, so a
//! crash, an immediate shutdown or a failover ends every fast lease. Their fences are not handed
//! out again: every fast fence is covered by the fast reservation, which every later grant starts
//! above (see `leases::state::fences`).
use pgrx::pg_sys;
use std::ffi::CStr;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Durable,
    Fast,
}

impl Kind {
    pub fn of(durable: bool) -> Kind {
        if durable {
            Kind::Durable
        } else {
            Kind::Fast
        }
    }

    pub fn table_name(self) -> &'static CStr {
        match self {
            Kind::Durable => c"lease_state",
            Kind::Fast => c"fast_lease_state",
        }
    }

    /// This kind's table, if it may be read here. A standby has no rows of fast leases, and
    /// PostgreSQL refuses to open an unlogged table during recovery; and before ALTER EXTENSION
    /// UPDATE to 0.4.0 there is no such table. A table missing otherwise is damaged state.
    pub fn table(self) -> Option<pg_sys::Oid> {
        // SAFETY: reads shared recovery state.
        if self == Kind::Fast && unsafe { pg_sys::RecoveryInProgress() } {
            return None;
        }
        let table = crate::pg::installed::table(self.table_name());
        if table.is_none() && (self == Kind::Durable || crate::pg::installed::since_0_4_0()) {
            let name = self.table_name().to_string_lossy();
            crate::pg::errors::state_damaged(&format!("table fence.{name} is missing"));
        }
        table
    }
}

/// `by_kind!(kind, statement)`: the statement macro `statement!(table)` over that kind's table.
macro_rules! by_kind {
    ($kind:expr, $statement:ident) => {
        match $kind {
            $crate::leases::state::kinds::Kind::Durable => $statement!("fence.lease_state"),
            $crate::leases::state::kinds::Kind::Fast => $statement!("fence.fast_lease_state"),
        }
    };
}

/// `by_kind!` for statements that also have a form, `$statement!(table, before_0_5_0)`, for the
/// objects of versions before 0.5.0 (see `installed`), whose tables record no ends.
macro_rules! by_objects {
    ($kind:expr, $statement:ident) => {
        if $crate::pg::installed::since_0_5_0() {
            by_kind!($kind, $statement)
        } else {
            match $kind {
                $crate::leases::state::kinds::Kind::Durable => $statement!("fence.lease_state", before_0_5_0),
                $crate::leases::state::kinds::Kind::Fast => {
                    $statement!("fence.fast_lease_state", before_0_5_0)
                }
            }
        }
    };
}
