//! The clocks. Liveness is judged by the server's clock, read the way every liveness decision must
//! read it: clock_timestamp(), the moment of the call, never now(), the start of the transaction.
//! How long a call waits is measured on the monotonic clock instead, which a step of the server's
//! clock (an NTP correction, a VM resumed) does not move.
use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReportable;
use std::time::{Duration, Instant};

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

/// The moment `micros` from now on the monotonic clock (a wait's deadline).
pub fn deadline_after(micros: i64) -> Instant {
    // input::wait bounds `micros` to 100 years, far within Instant's range.
    Instant::now() + Duration::from_micros(micros.max(0) as u64)
}

/// Microseconds from now until `deadline` on the monotonic clock; 0 once it has passed.
pub fn micros_until(deadline: Instant) -> i64 {
    i64::try_from(deadline.saturating_duration_since(Instant::now()).as_micros()).unwrap_or(i64::MAX)
}
