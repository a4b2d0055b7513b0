package io.pgfence;

import java.time.Duration;
import java.util.Objects;

/**
 * How {@link FenceClient#hold} keeps a lease: how often it renews, the margin taken off the local
 * deadline, the backoff between failed tries, the bound on an acquire's try and on the release, and
 * who is told of a loss. Immutable; the {@code with} methods return copies.
 */
public final class KeepOptions {
  private final Duration renewEvery;
  private final Duration margin;
  private final Backoff retry;
  private final Duration timeout;
  private final LeaseListener listener;

  private KeepOptions(
      Duration renewEvery,
      Duration margin,
      Backoff retry,
      Duration timeout,
      LeaseListener listener) {
    this.renewEvery = renewEvery;
    this.margin = margin;
    this.retry = Objects.requireNonNull(retry);
    this.timeout = Objects.requireNonNull(timeout);
    this.listener = listener;
  }

  /**
   * Renew every ttl/3, the default margin, {@link Backoff#defaults()}, a 10 s timeout.
   *
   * @return the default options, with no listener
   */
  public static KeepOptions defaults() {
    return new KeepOptions(null, null, Backoff.defaults(), Duration.ofSeconds(10), null);
  }

  /**
   * How often to renew: ttl/3 by default, so that two renewals in a row can fail and a third still
   * has time. Must be above zero and below ttl less the margin.
   *
   * @param every the time from one renewal's start to the next; null for ttl/3
   * @return a copy with this period
   */
  public KeepOptions renewEvery(Duration every) {
    return new KeepOptions(every, margin, retry, timeout, listener);
  }

  /**
   * Taken off the local deadline, so that the holder is told before the server's expiry: it covers
   * the telling and clocks that run at rates up to 0.1 % apart. By default max(ttl / 1000, min(ttl
   * / 50, 100 ms)).
   *
   * @param margin the time taken off the local deadline, not negative; null for the default
   * @return a copy with this margin
   */
  public KeepOptions margin(Duration margin) {
    return new KeepOptions(renewEvery, margin, retry, timeout, listener);
  }

  /**
   * Backoff between failed tries of the acquire, a renewal and the release.
   *
   * @param retry the backoff; not null
   * @return a copy with this backoff
   */
  public KeepOptions retry(Backoff retry) {
    return new KeepOptions(renewEvery, margin, retry, timeout, listener);
  }

  /**
   * Bounds one try of the acquire (beyond its wait) and the whole release; 10 s by default.
   *
   * @param timeout the bound, above zero; not null
   * @return a copy with this bound
   */
  public KeepOptions timeout(Duration timeout) {
    return new KeepOptions(renewEvery, margin, retry, timeout, listener);
  }

  /**
   * Told once when the lease is lost while held.
   *
   * @param listener told the lease and why it was lost, from the keeper's thread; null for none
   * @return a copy with this listener
   */
  public KeepOptions onLost(LeaseListener listener) {
    return new KeepOptions(renewEvery, margin, retry, timeout, listener);
  }

  Duration renewEveryFor(Duration ttl) {
    return renewEvery != null ? renewEvery : ttl.dividedBy(3);
  }

  Duration marginFor(Duration ttl) {
    if (margin != null) {
      return margin;
    }
    Duration fiftieth = ttl.dividedBy(50);
    Duration capped =
        fiftieth.compareTo(Duration.ofMillis(100)) < 0 ? fiftieth : Duration.ofMillis(100);
    Duration thousandth = ttl.dividedBy(1000);
    return thousandth.compareTo(capped) > 0 ? thousandth : capped;
  }

  Backoff retry() {
    return retry;
  }

  Duration timeout() {
    return timeout;
  }

  LeaseListener listener() {
    return listener;
  }
}
