//! The server's clock, read the way every liveness decision must read it: clock_timestamp(), the
//! moment of the call, never now(), the start of the transaction.
use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReportable;

/// clock_timestamp(), in microseconds since the PostgreSQL epoch.
pub fn now() -> i64 {
    // SAFETY: reads the system clock.
    unsafe { pg_sys::GetCurrentTimestamp() }
}

pub fn timestamp(micros: i64) -> TimestampWithTimeZone {
    TimestampWithTimeZone::try_from(micros).unwrap_or_report()
}
