//! How pg_fence fails. Every error names what was wrong and, in its HINT, what to do.
//!
//! SQLSTATEs raised from Rust (pgrx can only raise codes it knows):
//! - 22004 null_value_not_allowed: a required argument is NULL.
//! - 22023 invalid_parameter_value: an argument is out of range (empty key, bad ttl, ...).
//! - 25006 read_only_sql_transaction: a change was asked of a read-only transaction or a standby,
//!   or a guard of a standby.
//! - 0A000 feature_not_supported: lease_acquire with wait under REPEATABLE READ or SERIALIZABLE;
//!   PREPARE TRANSACTION after a fast grant.
//! - 42P01 undefined_table, 42703 undefined_column, 42809 wrong_object_type, 42804
//!   datatype_mismatch: the target of a fenced or versioned write is not what it must be.
//! - 42883 undefined_function: a filter column's type has no equality operator.
//! - 40001 serialization_failure: versioned_update found another version, a guard raced the
//!   update from 0.3.0, a REPEATABLE READ acquire's snapshot predates the deletion of its key's
//!   row, or a REPEATABLE READ renew, release or revoke's snapshot predates the lease's grant, or
//!   a key of a lease set could not be granted after all were found free (retry).
//! - P0002 no_data_found, 21000 cardinality_violation: versioned_update matched no row, or several.
//! - 25001 active_sql_transaction: fence.sweep() inside a transaction block.
//! - 55000 object_not_in_prerequisite_state: a table of schema fence is missing or was edited by hand.
//! - 55P03 lock_not_available: lease_handoff found the old holder's writes still running.
//!
//! PostgreSQL's own errors that pg_fence passes on: 57014 query_canceled (cancel or
//! statement_timeout) and 55P03 lock_not_available (the caller's lock_timeout) from a waiting acquire.
//!
//! pg_fence's own codes (class PF): PF001 by lease_renew's SQL shell (sql/leases.sql), PF002 by the
//! fenced writes' C entry points (src/pg/own_errors.rs):
//! - PF001 lease_lost: renew with a token that is not the live holder's.
//! - PF002 stale_fence: a write under a fence that is no longer the key's live one.
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{PgLogLevel, PgSqlErrorCode};

fn raise(code: PgSqlErrorCode, message: String, hint: &str) -> ! {
    ErrorReport::new(code, message, "pg_fence").set_hint(hint).report(PgLogLevel::ERROR);
    unreachable!("ERROR-level reports do not return")
}

pub fn null_argument(arg: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
        format!("{arg} must not be NULL"),
        "Pass a value for every required argument of pg_fence's functions.",
    )
}

pub fn invalid_argument(message: String, hint: &str) -> ! {
    raise(PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, message, hint)
}

pub fn read_only(what: &str, on_standby: bool) -> ! {
    let (message, hint) = if on_standby {
        (
            format!("cannot {what} on a standby server"),
            "Leases live on the primary: connect to it (for example with target_session_attrs=read-write).",
        )
    } else {
        (format!("cannot {what} in a read-only transaction"), "Run the call in a read-write transaction.")
    };
    raise(PgSqlErrorCode::ERRCODE_READ_ONLY_SQL_TRANSACTION, message, hint)
}

pub fn wait_needs_read_committed() -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
        "lease_acquire cannot wait in a REPEATABLE READ or SERIALIZABLE transaction".into(),
        "Call it with wait in a READ COMMITTED transaction (the default), ideally on its own.",
    )
}

pub fn undefined_table(relid: pgrx::pg_sys::Oid) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
        format!("relation with OID {} does not exist", relid.to_u32()),
        "Pass the table as a name, such as 'invoices' or 'billing.invoices'.",
    )
}

pub fn undefined_column(column: &str, table: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_UNDEFINED_COLUMN,
        format!("column \"{column}\" of {table} does not exist"),
        "The keys of changes and filter must be column names of the table, spelled exactly.",
    )
}

pub fn no_equality(column: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_UNDEFINED_FUNCTION,
        format!("filter column \"{column}\" has a type without an equality operator"),
        "Filter on columns whose type can be compared with =, such as the primary key.",
    )
}

pub fn wrong_object_type(message: String) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_WRONG_OBJECT_TYPE,
        message,
        "Write to the table itself, not to a view, sequence or other relation.",
    )
}

pub fn datatype_mismatch(message: String) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
        message,
        "Fences and versions are kept in an integer column (bigint is best).",
    )
}

pub fn no_row(table: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_NO_DATA_FOUND,
        format!("no row of {table} matches the filter"),
        "Check the filter; versioned_update changes exactly one existing row.",
    )
}

pub fn not_one_row(table: &str, found: usize) -> ! {
    let found = if found > 1 { "more than one row".to_string() } else { format!("{found} rows") };
    raise(
        PgSqlErrorCode::ERRCODE_CARDINALITY_VIOLATION,
        format!("the filter matches {found} of {table}; versioned_update changes exactly one"),
        "Filter on a unique key, such as the primary key.",
    )
}

pub fn version_mismatch(table: &str, expected: i64, actual: Option<i64>) -> ! {
    let actual = actual.map_or("NULL".to_string(), |v| v.to_string());
    raise(
        PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
        format!("version conflict on {table}: expected version {expected}, the row has {actual}"),
        "Another writer changed the row first: read it again and retry.",
    )
}

/// One of pg_fence's own tables is missing or was edited by hand.
pub fn state_damaged(what: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("{what}: pg_fence's state in schema fence was changed by hand"),
        "Restore schema fence from a backup. Do not DROP and CREATE EXTENSION pg_fence to repair it: \
         every key's fence would start again at 1, and stale holders' fences would pass again.",
    )
}

/// pg_fence was dropped (or its tables replaced) while a call waited.
pub fn dropped_while_waiting() -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        "pg_fence was dropped while this call waited".into(),
        "Its leases are gone with it; after CREATE EXTENSION pg_fence, acquire again.",
    )
}

pub fn sweep_in_transaction_block() -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_ACTIVE_SQL_TRANSACTION,
        "fence.sweep() cannot run inside a transaction block".into(),
        "Call it on its own (autocommit), as the sweeper worker and pg_cron do: the leases it sweeps \
         stay locked until its transaction ends, and their next acquirers would wait for it.",
    )
}

pub fn version_overflow(table: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE,
        format!("the row of {table} is at the highest version its column can hold"),
        "Widen the version column to bigint, or start its versions again from 1.",
    )
}

pub fn deleted_since_snapshot() -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
        "the key's lease row was deleted after this transaction's snapshot was taken".into(),
        "Retry the transaction, or acquire in READ COMMITTED.",
    )
}

/// Under REPEATABLE READ or SERIALIZABLE: the key's live lease was granted after the snapshot, so
/// the transaction's statements cannot see the row they must change.
pub fn granted_after_snapshot() -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
        "the key's lease was granted after this transaction's snapshot was taken".into(),
        "Retry the transaction, or call it in READ COMMITTED.",
    )
}

pub fn prepare_after_fast_grant() -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
        "cannot PREPARE a transaction that granted a fast lease".into(),
        "Grant fast leases (durable => false) outside two-phase transactions, or grant durable ones.",
    )
}

/// A change to a fast lease in shared memory, in a transaction then prepared.
pub fn prepare_after_fast_change() -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
        "cannot PREPARE a transaction that changed a fast lease".into(),
        "Acquire, renew and release fast leases (durable => false) outside two-phase transactions, or use durable ones.",
    )
}

/// Shared memory has no row left for another fast lease's key.
pub fn fast_leases_full((used, reserved, capacity): (u32, u32, u32)) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
        format!(
            "no room for another fast lease: all {capacity} rows of pg_fence.fast_leases are taken \
             ({used} in use, {reserved} reserved by transactions still open)"
        ),
        "Release fast leases you no longer need (a grant that finds no room frees the rows of ended \
         ones in its own database; other databases' are freed by their sweep), use a durable lease, \
         or raise pg_fence.fast_leases and restart the server.",
    )
}

/// The session's role has as many rows of fast leases as pg_fence.fast_leases_per_role allows.
pub fn fast_leases_role_limit(limit: u32) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
        format!(
            "no room for another fast lease of this role: it has {limit} rows of fast leases \
             (pg_fence.fast_leases_per_role)"
        ),
        "Release fast leases you no longer need (a grant that finds no room frees the rows of this \
         role's ended ones in this database), use a durable lease, or raise pg_fence.fast_leases_per_role.",
    )
}

/// lease_handoff waited in vain for the writes made under the lease it ends, in other transactions.
pub fn handoff_blocked(key: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE,
        format!("the lease on key \"{key}\" cannot be handed off while writes under it are running"),
        "Let the transactions writing under the lease end, then call lease_handoff again.",
    )
}

/// A key of a lease set could not be granted after every key had been found free under its lock.
pub fn set_changed() -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
        "a key of the lease set could not be granted; none of them is".into(),
        "Retry the transaction, or call lease_acquire_all in READ COMMITTED.",
    )
}

pub fn lock_hash_changed() -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
        "pg_fence was updated while this guard was being taken".into(),
        "Retry the transaction: the update changed how keys are locked.",
    )
}
