//! How pg_fence fails. Every error names what was wrong and, in its HINT, what to do.
//!
//! SQLSTATEs raised from Rust (pgrx can only raise codes it knows):
//! - 22004 null_value_not_allowed: a required argument is NULL.
//! - 22023 invalid_parameter_value: an argument is out of range (empty key, bad ttl, ...).
//! - 25006 read_only_sql_transaction: a change was asked of a read-only transaction or a standby.
//!
//! pg_fence's own codes (class PF) are raised by the SQL shells in sql/api.sql:
//! - PF001 lease_lost: renew with a token that is not the live holder's.
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{PgLogLevel, PgSqlErrorCode};

fn raise(code: PgSqlErrorCode, message: String, hint: &str) -> ! {
    ErrorReport::new(code, message, "pg_fence")
        .set_hint(hint)
        .report(PgLogLevel::ERROR);
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
        (
            format!("cannot {what} in a read-only transaction"),
            "Run the call in a read-write transaction.",
        )
    };
    raise(PgSqlErrorCode::ERRCODE_READ_ONLY_SQL_TRANSACTION, message, hint)
}
