//! The two kinds of lease: durable ones, in the logged table fence.lease_state, and fast ones
//! (`lease_acquire(.., durable => false)`), in the unlogged table fence.fast_lease_state.
//!
//! Both share one key namespace, one key lock and one fence sequence: a grant of either kind takes
//! the key's lock, finds no live lease of the other kind, and starts above the other kind's fence.
//! A fast lease's changes write no WAL but their commit record, so its grant waits for no flush;
//! PostgreSQL empties an unlogged table after a crash, and a standby has none of its rows, so a
//! crash, an immediate shutdown or a failover ends every fast lease. Nothing remembers their
//! fences then: the clock floor (see `fence_numbers`) puts every later grant above them.
use crate::spi_plans::execute;
use pgrx::datum::{DatumWithOid, FromDatum, IntoDatum};
use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReportable;
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

    pub fn other(self) -> Kind {
        match self {
            Kind::Durable => Kind::Fast,
            Kind::Fast => Kind::Durable,
        }
    }

    pub fn table_name(self) -> &'static CStr {
        match self {
            Kind::Durable => c"lease_state",
            Kind::Fast => c"fast_lease_state",
        }
    }

    /// Whether this kind's table may be read here. A standby has no rows of fast leases, and
    /// PostgreSQL refuses to open an unlogged table during recovery; and before ALTER EXTENSION
    /// UPDATE to 0.4.0 there is no such table.
    pub fn readable(self) -> bool {
        // SAFETY: reads shared recovery state.
        self == Kind::Durable || (crate::installed::since_0_4_0() && unsafe { !pg_sys::RecoveryInProgress() })
    }
}

/// `both_kinds!(statement)`: the statement macro `statement!(table)`, which returns one column, run
/// over both tables in one statement; each row comes with a second column, true for a durable lease.
/// At most one of the two matches a key's live lease.
macro_rules! both_kinds {
    ($statement:ident) => {
        concat!(
            "WITH durable AS (",
            $statement!("fence.lease_state"),
            "), fast AS (",
            $statement!("fence.fast_lease_state"),
            ") SELECT *, true FROM durable UNION ALL SELECT *, false FROM fast"
        )
    };
}

/// `durable_only!(statement)`: the same over fence.lease_state alone, for the objects of a version
/// before 0.4.0 (and for standbys, where the statements that use it are refused anyway).
macro_rules! durable_only {
    ($statement:ident) => {
        concat!("WITH durable AS (", $statement!("fence.lease_state"), ") SELECT *, true FROM durable")
    };
}

/// The statement over both kinds where fast leases may be read, else the one over durable leases.
pub fn statement(both: &'static str, durable_only: &'static str) -> &'static str {
    if Kind::Fast.readable() {
        both
    } else {
        durable_only
    }
}

/// Runs a `both_kinds!` (or `durable_only!`) statement: its first row's value, and the kind of the
/// lease it came from.
pub fn execute_by_kind<T: IntoDatum + FromDatum>(
    statement: &str,
    args: &[DatumWithOid],
) -> Option<(T, Kind)> {
    execute(statement, args, |rows| {
        if rows.is_empty() {
            return None;
        }
        let row = rows.first();
        let value = row.get::<T>(1).unwrap_or_report()?;
        Some((value, Kind::of(row.get::<bool>(2).unwrap_or_report().unwrap_or(true))))
    })
}
