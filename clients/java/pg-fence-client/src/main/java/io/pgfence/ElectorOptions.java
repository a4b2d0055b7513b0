package io.pgfence;

import java.time.Duration;
import java.util.Objects;
import java.util.Optional;
import java.util.function.Consumer;

/**
 * What an {@link Elector} is asked for: the leadership's lease ({@link #lease(AcquireOptions)}: its
 * ttl, durable, session-bound, lock-delay; the campaign sets the owner, the wait and the token),
 * how it is kept, whether a cancel releases, how long one wait of an observer lasts, and the
 * callbacks. Immutable; each method returns a copy.
 */
public final class ElectorOptions implements Cloneable {
  // Never changed once an instance is handed out: each method changes a fresh copy.
  private AcquireOptions lease;
  private KeepOptions keep = KeepOptions.defaults();
  private boolean releaseOnCancel = true;
  private Duration observeTimeout = Duration.ofSeconds(30);
  private Consumer<Leadership> onStartedLeading;
  private Consumer<StopReason> onStoppedLeading;
  private Consumer<Optional<Leader>> onNewLeader;
  private Consumer<ObserverBlindException> onBlind;

  private ElectorOptions(AcquireOptions lease) {
    this.lease = lease;
  }

  /**
   * Leaderships of {@code ttl}, durable, released on cancel, observers waiting 30 s at a time.
   *
   * @param ttl the leadership lease's time to live, as for {@link AcquireOptions#ttl(Duration)}
   * @return the options
   */
  public static ElectorOptions ttl(Duration ttl) {
    return new ElectorOptions(AcquireOptions.ttl(ttl));
  }

  private ElectorOptions with(Consumer<ElectorOptions> change) {
    try {
      ElectorOptions copy = (ElectorOptions) super.clone();
      change.accept(copy);
      return copy;
    } catch (CloneNotSupportedException e) {
      throw new AssertionError(e);
    }
  }

  /**
   * The leadership's lease: ttl, durable, session-bound, lock-delay (the campaign sets the owner,
   * the wait and the token).
   *
   * @param lease the lease's options; their owner, wait and token are replaced by the campaign's
   * @return a copy with this lease
   * @throws IllegalArgumentException for a shared lease, permits, or options that cannot work
   *     together
   */
  public ElectorOptions lease(AcquireOptions lease) {
    lease.check();
    if (lease.isShared() || lease.permits() != 1) {
      throw new IllegalArgumentException(
          "a leadership is an exclusive lease: no shared, no permits");
    }
    return with(copy -> copy.lease = lease);
  }

  /**
   * How the leadership's lease is kept (its listener is told of a loss too).
   *
   * @param keep the keeping options; not null
   * @return a copy with these keeping options
   */
  public ElectorOptions keep(KeepOptions keep) {
    Objects.requireNonNull(keep);
    return with(copy -> copy.keep = keep);
  }

  /**
   * Whether closing the elector releases a leadership it holds (true, the default, so the next
   * candidate is elected at once) or leaves it to expire at its TTL ({@code cancelled}), for work
   * that may outlive the cancel.
   *
   * @param release true to release at close, false to leave the lease to expire
   * @return a copy with this choice
   */
  public ElectorOptions releaseOnCancel(boolean release) {
    return with(copy -> copy.releaseOnCancel = release);
  }

  /**
   * How long one wait of an observer lasts before it asks again (30 s).
   *
   * @param timeout one wait's length, above zero; a wait is cut to half the TTL when longer, so
   *     that the server answers at least twice a TTL; not null
   * @return a copy with this timeout
   */
  public ElectorOptions observeTimeout(Duration timeout) {
    Objects.requireNonNull(timeout);
    return with(copy -> copy.observeTimeout = timeout);
  }

  /**
   * Told, from {@code campaign}, before it returns the leadership.
   *
   * @param callback given the new leadership, on the campaigning thread; null for none
   * @return a copy with this callback
   */
  public ElectorOptions onStartedLeading(Consumer<Leadership> callback) {
    return with(copy -> copy.onStartedLeading = callback);
  }

  /**
   * Told once, after the start, when a leadership ends, with why.
   *
   * @param callback given why the leadership ended; null for none
   * @return a copy with this callback
   */
  public ElectorOptions onStoppedLeading(Consumer<StopReason> callback) {
    return with(copy -> copy.onStoppedLeading = callback);
  }

  /**
   * Told the key's present leader first (empty: nobody leads), then each change of it, from a
   * thread of the elector's.
   *
   * @param callback given each leader, empty when nobody leads; null for none (and no thread)
   * @return a copy with this callback
   */
  public ElectorOptions onNewLeader(Consumer<Optional<Leader>> callback) {
    return with(copy -> copy.onNewLeader = callback);
  }

  /**
   * Told, from the thread that tells {@link #onNewLeader}, when it cannot see the key ({@link
   * ObserverBlindException}: no answer from the server for the TTL); what it last told may be over.
   * It goes on observing, and tells the leader again once it sees.
   *
   * @param callback given the blindness, whose cause is the last error seen; null for none
   * @return a copy with this callback
   */
  public ElectorOptions onBlind(Consumer<ObserverBlindException> callback) {
    return with(copy -> copy.onBlind = callback);
  }

  AcquireOptions lease() {
    return lease;
  }

  KeepOptions keep() {
    return keep;
  }

  boolean releaseOnCancel() {
    return releaseOnCancel;
  }

  Duration observeTimeout() {
    return observeTimeout;
  }

  Consumer<Leadership> onStartedLeading() {
    return onStartedLeading;
  }

  Consumer<StopReason> onStoppedLeading() {
    return onStoppedLeading;
  }

  Consumer<Optional<Leader>> onNewLeader() {
    return onNewLeader;
  }

  Consumer<ObserverBlindException> onBlind() {
    return onBlind;
  }
}
