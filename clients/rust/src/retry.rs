use rand::Rng;
use std::time::{Duration, Instant};

/// Exponential backoff with full jitter: before retry `n` (from 0) sleep a uniformly random time in
/// `[0, min(cap, base * 2^n)]`. Full jitter spreads clients that failed together (a server restart)
/// so their retries do not arrive together. Retries end after `max_attempts` tries or once
/// `max_elapsed` has passed since the first failed try, whichever comes first (None: no such bound).
#[derive(Debug, Clone)]
pub struct Backoff {
    pub base: Duration,
    pub cap: Duration,
    pub max_attempts: Option<u32>,
    pub max_elapsed: Option<Duration>,
}

/// By default the time is the bound: tries go on for 30 s, which a restart or a failover of
/// several seconds fits in, however quickly each try fails (a refused connection fails at once).
impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: Duration::from_millis(50),
            cap: Duration::from_secs(2),
            max_attempts: None,
            max_elapsed: Some(Duration::from_secs(30)),
        }
    }
}

impl Backoff {
    /// The most that retry `n` sleeps: `min(cap, base * 2^n)`.
    pub fn ceiling(&self, retry: u32) -> Duration {
        let factor = 2u32.checked_pow(retry).unwrap_or(u32::MAX);
        self.base.checked_mul(factor).unwrap_or(self.cap).min(self.cap)
    }

    /// A random sleep for retry `n`, within `[0, ceiling(n)]`.
    pub fn delay(&self, retry: u32) -> Duration {
        let ceiling = self.ceiling(retry).as_nanos() as u64;
        Duration::from_nanos(rand::thread_rng().gen_range(0..=ceiling))
    }

    /// The sleep before the next try, after `tries` tries since `started`; None when retries ran out.
    pub fn next(&self, tries: u32, started: Instant) -> Option<Duration> {
        if self.max_attempts.is_some_and(|max| tries >= max) {
            return None;
        }
        let delay = self.delay(tries.saturating_sub(1));
        match self.max_elapsed {
            Some(limit) if started.elapsed() + delay >= limit => None,
            _ => Some(delay),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backoff() -> Backoff {
        Backoff {
            base: Duration::from_millis(10),
            cap: Duration::from_millis(300),
            max_attempts: Some(5),
            max_elapsed: None,
        }
    }

    #[test]
    fn the_ceiling_doubles_up_to_the_cap() {
        let b = backoff();
        let ceilings: Vec<u64> = (0..8).map(|n| b.ceiling(n).as_millis() as u64).collect();
        assert_eq!(ceilings, [10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(b.ceiling(200), b.cap, "no overflow for huge retry counts");
    }

    #[test]
    fn full_jitter_stays_within_zero_and_the_ceiling_and_spreads_over_it() {
        let b = backoff();
        for retry in 0..10 {
            let ceiling = b.ceiling(retry);
            let delays: Vec<Duration> = (0..2000).map(|_| b.delay(retry)).collect();
            assert!(delays.iter().all(|d| *d <= ceiling), "retry {retry}: a delay above {ceiling:?}");
            // Full jitter, not "ceiling plus a little": both halves of the range are used.
            assert!(delays.iter().any(|d| *d < ceiling / 4), "retry {retry}: never low");
            assert!(delays.iter().any(|d| *d > ceiling * 3 / 4), "retry {retry}: never high");
        }
    }

    #[test]
    fn retries_end_after_max_attempts_or_max_elapsed() {
        let b = backoff();
        let now = Instant::now();
        assert!((1..5).all(|tries| b.next(tries, now).is_some()));
        assert_eq!(b.next(5, now), None);
        let b = Backoff { max_elapsed: Some(Duration::from_millis(50)), max_attempts: Some(100), ..b };
        let long_ago = now - Duration::from_secs(1);
        assert_eq!(b.next(1, long_ago), None);
        assert!(b.next(1, Instant::now()).unwrap() <= b.ceiling(0));
    }

    #[test]
    fn by_default_only_the_time_ends_retries() {
        // Tries that fail at once (a refused connection) use up no time: only max_elapsed ends them.
        let b = Backoff::default();
        let now = Instant::now();
        assert!(b.next(1000, now).is_some(), "gave up after a number of tries, not after max_elapsed");
        assert_eq!(b.next(1, now - b.max_elapsed.unwrap()), None);
    }
}
