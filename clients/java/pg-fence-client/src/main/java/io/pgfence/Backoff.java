package io.pgfence;

import java.time.Duration;
import java.util.concurrent.ThreadLocalRandom;

/**
 * Exponential backoff with full jitter: before retry {@code n} (from 0) sleep a uniformly random
 * time in {@code [0, min(cap, base * 2^n)]}, so clients that failed together (a server restart) do
 * not come back together. Retries end after {@code maxAttempts} tries (0: no such bound) or once
 * {@code maxElapsed} has passed since the call's first failure, whichever comes first: the time a
 * try took before it failed (an acquire's wait for the key) is not the retries' time.
 *
 * @param base the ceiling of the first retry's sleep
 * @param cap the highest ceiling
 * @param maxAttempts tries at most; 0 for no bound
 * @param maxElapsed no retry starts after this long since the call's first failure
 */
public record Backoff(Duration base, Duration cap, int maxAttempts, Duration maxElapsed) {

  /**
   * 50 ms, 2 s, no bound on tries, 30 s: a restart or a failover of several seconds is waited out
   * however quickly each try is refused.
   *
   * @return the default backoff
   */
  public static Backoff defaults() {
    return new Backoff(Duration.ofMillis(50), Duration.ofSeconds(2), 0, Duration.ofSeconds(30));
  }

  /**
   * The most that retry {@code n} sleeps: {@code min(cap, base * 2^n)}.
   *
   * @param retry the retry's number {@code n}, from 0 for the first retry; not negative
   * @return the ceiling of its sleep, at most {@code cap}
   */
  public Duration ceiling(int retry) {
    if (retry >= 62) {
      return cap;
    }
    long factor = 1L << retry;
    long nanos = base.toNanos();
    if (nanos > cap.toNanos() / factor) {
      return cap;
    }
    return Duration.ofNanos(Math.min(cap.toNanos(), nanos * factor));
  }

  /**
   * A random sleep for retry {@code n}, within {@code [0, ceiling(n)]}.
   *
   * @param retry the retry's number {@code n}, from 0 for the first retry; not negative
   * @return the sleep, drawn uniformly at nanosecond resolution
   */
  public Duration delay(int retry) {
    long ceiling = ceiling(retry).toNanos();
    return Duration.ofNanos(ThreadLocalRandom.current().nextLong(ceiling + 1));
  }

  /**
   * The sleep before the next try, after {@code tries} tries, the retries' time counted from {@code
   * startedNanos} ({@link System#nanoTime()}, the call's first failure); null when retries ran out.
   *
   * @param tries the tries made so far, the first included (1 after the first failure)
   * @param startedNanos {@link System#nanoTime()} when the retries' time began: the call's first
   *     failure (its start for a call bounded in all)
   * @return the sleep before the next try; null when {@code maxAttempts} tries were made or the
   *     sleep would end past {@code maxElapsed}
   */
  public Duration next(int tries, long startedNanos) {
    if (maxAttempts > 0 && tries >= maxAttempts) {
      return null;
    }
    Duration delay = delay(Math.max(0, tries - 1));
    long elapsed = System.nanoTime() - startedNanos;
    if (elapsed + delay.toNanos() >= maxElapsed.toNanos()) {
      return null;
    }
    return delay;
  }
}
