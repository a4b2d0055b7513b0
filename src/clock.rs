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

/// Whole milliseconds, rounded up, for timeouts that must not end before `micros` have passed.
pub fn millis_rounded_up(micros: i64) -> i64 {
    micros.saturating_add(999).div_euclid(1000)
}
