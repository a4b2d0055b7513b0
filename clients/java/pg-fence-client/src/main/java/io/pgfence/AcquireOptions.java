package io.pgfence;

import java.time.Duration;
import java.util.Objects;
import java.util.Optional;
import java.util.UUID;

/**
 * What {@code lease_acquire} is asked for: {@link #ttl(Duration)} and the server's defaults,
 * changed by the {@code with} methods (each returns a copy).
 *
 * <pre>{@code
 * AcquireOptions opts = AcquireOptions.ttl(Duration.ofSeconds(30))
 *     .owner("billing-7")
 *     .waitFor(Duration.ofSeconds(5));
 * }</pre>
 */
public final class AcquireOptions implements Cloneable {
  // Never changed once an instance is handed out: each `with` method changes a fresh copy.
  private Duration ttl;
  private String owner;
  private Duration wait = Duration.ZERO;
  private boolean sessionBound;
  private boolean durable = true;
  private boolean shared;
  private int permits = 1;
  private UUID token;
  private Duration lockDelay = Duration.ZERO;

  private AcquireOptions(Duration ttl) {
    this.ttl = Objects.requireNonNull(ttl, "ttl");
  }

  /**
   * A lease for {@code ttl}, with the server's defaults for the rest.
   *
   * @param ttl the lease's time to live from each grant or renewal: above zero and at most the
   *     server's {@code pg_fence.max_ttl} (1 day by default), sent rounded to the microsecond; not
   *     null
   * @return the options
   */
  public static AcquireOptions ttl(Duration ttl) {
    return new AcquireOptions(ttl);
  }

  /** A copy of these options, with {@code change} made to it. */
  private AcquireOptions with(java.util.function.Consumer<AcquireOptions> change) {
    try {
      AcquireOptions copy = (AcquireOptions) super.clone();
      change.accept(copy);
      return copy;
    } catch (CloneNotSupportedException e) {
      throw new AssertionError(e);
    }
  }

  /**
   * A free label for humans; the session's application_name when null or empty.
   *
   * @param owner the label, at most 256 bytes in UTF-8; null for the session's application_name
   * @return a copy with this owner
   */
  public AcquireOptions owner(String owner) {
    return with(copy -> copy.owner = owner);
  }

  /**
   * Wait up to this long for the key to be free (zero, the default: refused at once).
   *
   * @param wait how long the server waits for the key, not negative; not null
   * @return a copy with this wait
   */
  public AcquireOptions waitFor(Duration wait) {
    Objects.requireNonNull(wait, "wait");
    return with(copy -> copy.wait = wait);
  }

  /**
   * The lease ends with the session that took it (a direct or session-pooled connection).
   *
   * @param sessionBound true to end the lease with its session as well as at its expiry
   * @return a copy with this choice
   */
  public AcquireOptions sessionBound(boolean sessionBound) {
    return with(copy -> copy.sessionBound = sessionBound);
  }

  /**
   * False for a fast lease: no WAL flush, lost in a crash or a failover.
   *
   * @param durable true (the default) for a lease that outlives a crash of the server
   * @return a copy with this choice
   */
  public AcquireOptions durable(boolean durable) {
    return with(copy -> copy.durable = durable);
  }

  /**
   * A shared (reader's) lease: any number at once, never beside an exclusive one.
   *
   * @param shared true for a shared lease; not with {@link #permits(int)} above 1
   * @return a copy with this choice
   */
  public AcquireOptions shared(boolean shared) {
    return with(copy -> copy.shared = shared);
  }

  /**
   * One of at most {@code permits} live leases of the key (a semaphore); 1 is exclusive.
   *
   * @param permits how many holders the key allows at once, 1 to 10,000; when callers disagree, the
   *     smallest count of any live holder bounds them all
   * @return a copy with these permits
   */
  public AcquireOptions permits(int permits) {
    return with(copy -> copy.permits = permits);
  }

  /**
   * The lease's token. A retried acquire must carry the same one, so that a retry after a lost
   * reply gets the lease that reply granted: {@link FenceClient} draws one before the first try.
   *
   * @param token the token, not the nil uuid; null to let the server (or the client) draw one
   * @return a copy with this token
   */
  public AcquireOptions token(UUID token) {
    return with(copy -> copy.token = token);
  }

  /**
   * Keep the key from every grant for this long after this lease ends other than by a release
   * (Consul's lock-delay; at most an hour). Zero, the default, for none.
   *
   * @param lockDelay how long the key stays closed after an expiry, a revocation or the end of a
   *     session-bound lease's session: zero to one hour; not null
   * @return a copy with this lock-delay
   */
  public AcquireOptions lockDelay(Duration lockDelay) {
    Objects.requireNonNull(lockDelay, "lockDelay");
    return with(copy -> copy.lockDelay = lockDelay);
  }

  /**
   * The same options with another ttl.
   *
   * @param ttl the time to live, as for {@link #ttl(Duration)}; not null
   * @return a copy with this ttl
   */
  public AcquireOptions withTtl(Duration ttl) {
    Objects.requireNonNull(ttl, "ttl");
    return with(copy -> copy.ttl = ttl);
  }

  /**
   * The lease's time to live, from each grant or renewal.
   *
   * @return the ttl, never null
   */
  public Duration ttl() {
    return ttl;
  }

  /**
   * The owner label.
   *
   * @return the label; empty for the session's application_name
   */
  public Optional<String> owner() {
    return Optional.ofNullable(owner);
  }

  /**
   * How long an acquire waits for the key to be free.
   *
   * @return the wait; zero for none (refused at once)
   */
  public Duration waitTime() {
    return wait;
  }

  /**
   * Whether the lease ends with the session that took it.
   *
   * @return true for a session-bound lease
   */
  public boolean isSessionBound() {
    return sessionBound;
  }

  /**
   * A durable lease (the default), or a fast one that a crash of the server forgets.
   *
   * @return true for a durable lease, false for a fast one
   */
  public boolean isDurable() {
    return durable;
  }

  /**
   * Whether the lease is shared (a reader's), beside other shared ones.
   *
   * @return true for a shared lease, false for an exclusive one or a permit
   */
  public boolean isShared() {
    return shared;
  }

  /**
   * The permits of the key as a semaphore.
   *
   * @return how many holders the key allows at once; 1 for an exclusive lease
   */
  public int permits() {
    return permits;
  }

  /**
   * The token the acquire carries.
   *
   * @return the token; empty when the server makes one
   */
  public Optional<UUID> token() {
    return Optional.ofNullable(token);
  }

  /**
   * How long the key is kept from every grant after this lease ends other than by a release.
   *
   * @return the lock-delay; zero for none
   */
  public Duration lockDelay() {
    return lockDelay;
  }

  /**
   * These options with a token: their own, or a fresh random one.
   *
   * @return these options when they carry a token, else a copy with a random one
   */
  public AcquireOptions withToken() {
    return token != null ? this : token(UUID.randomUUID());
  }

  /**
   * {@link IllegalArgumentException}, before anything is sent, for options that cannot work
   * together: {@code permits} below 1, {@code shared} with {@code permits} above 1.
   */
  void check() {
    if (permits < 1) {
      throw new IllegalArgumentException("permits must be at least 1");
    }
    if (shared && permits > 1) {
      throw new IllegalArgumentException(
          "a shared lease cannot have permits: shared or permits, not both");
    }
  }

  /** {@link #check()}, and what {@code lease_acquire_all} cannot take. */
  void checkForSet() {
    check();
    if (token != null || shared || permits != 1 || !lockDelay.isZero()) {
      throw new IllegalArgumentException(
          "a lease set takes no token, shared, permits or lock_delay");
    }
  }

  @Override
  public String toString() {
    return "AcquireOptions[ttl="
        + ttl
        + ", owner="
        + owner
        + ", wait="
        + wait
        + ", sessionBound="
        + sessionBound
        + ", durable="
        + durable
        + ", shared="
        + shared
        + ", permits="
        + permits
        + ", lockDelay="
        + lockDelay
        + "]";
  }
}
