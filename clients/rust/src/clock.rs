//! The clock the local deadline is judged by. The server's TTL runs on its wall clock, which goes
//! on while this host is suspended; CLOCK_MONOTONIC (`Instant`, tokio's timers) stops then, so a
//! deadline kept as an `Instant` would pass a suspend's length too late. CLOCK_BOOTTIME counts the
//! suspend (Linux; elsewhere this falls back to `Instant`). Tokio's timers still do the waking,
//! late after a suspend, which is why the deadline is checked against this clock, not them.
use std::ops::{Add, Sub};
use std::time::{Duration, Instant};

/// An instant of this host, on both clocks: `at` for tokio's timers, `boot` to judge by.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stamp {
    pub at: Instant,
    boot: Duration,
}

impl Stamp {
    pub fn now() -> Stamp {
        Stamp { at: Instant::now(), boot: boot_time() }
    }

    /// Whether this instant has passed, counting any suspend since.
    pub fn passed(&self) -> bool {
        boot_time() >= self.boot
    }

    /// The time until this instant, counting any suspend since; zero once it has passed.
    pub fn left(&self) -> Duration {
        self.boot.saturating_sub(boot_time())
    }

    /// This instant as seen after a suspend of `length`: by Instant as it was, by boot time earlier.
    #[cfg(test)]
    pub fn after_suspend(self, length: Duration) -> Stamp {
        Stamp { at: self.at, boot: self.boot.saturating_sub(length) }
    }

    /// The time since this instant, counting any suspend since.
    pub fn elapsed(&self) -> Duration {
        boot_time().saturating_sub(self.boot)
    }
}

impl Add<Duration> for Stamp {
    type Output = Stamp;

    fn add(self, span: Duration) -> Stamp {
        Stamp { at: self.at + span, boot: self.boot + span }
    }
}

impl Sub<Duration> for Stamp {
    type Output = Stamp;

    fn sub(self, span: Duration) -> Stamp {
        Stamp { at: self.at - span, boot: self.boot.saturating_sub(span) }
    }
}

#[cfg(target_os = "linux")]
fn boot_time() -> Duration {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime only writes the timespec it is given; CLOCK_BOOTTIME exists since 2.6.39.
    let failed = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now) } != 0;
    assert!(!failed, "clock_gettime(CLOCK_BOOTTIME) failed");
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

#[cfg(not(target_os = "linux"))]
fn boot_time() -> Duration {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_clocks_move_together_without_a_suspend() {
        let start = Stamp::now();
        std::thread::sleep(Duration::from_millis(20));
        let (boot, mono) = (start.elapsed(), start.at.elapsed());
        assert!(boot >= Duration::from_millis(20) && boot.abs_diff(mono) < Duration::from_millis(5));
        let later = Stamp::now() + Duration::from_secs(60);
        assert!(!later.passed() && later.left() > Duration::from_secs(59));
        assert!((later - Duration::from_secs(61)).passed());
    }
}
