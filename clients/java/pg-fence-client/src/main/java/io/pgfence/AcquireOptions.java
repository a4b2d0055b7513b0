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

  /** A lease for {@code ttl}, with the server's defaults for the rest. */
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

  /** A free label for humans; the session's application_name when null or empty. */
  public AcquireOptions owner(String owner) {
    return with(copy -> copy.owner = owner);
  }

  /** Wait up to this long for the key to be free (zero, the default: refused at once). */
  public AcquireOptions waitFor(Duration wait) {
    Objects.requireNonNull(wait, "wait");
    return with(copy -> copy.wait = wait);
  }

  /** The lease ends with the session that took it (a direct or session-pooled connection). */
  public AcquireOptions sessionBound(boolean sessionBound) {
    return with(copy -> copy.sessionBound = sessionBound);
  }

  /** False for a fast lease: no WAL flush, lost in a crash or a failover. */
  public AcquireOptions durable(boolean durable) {
    return with(copy -> copy.durable = durable);
  }

  /** A shared (reader's) lease: any number at once, never beside an exclusive one. */
  public AcquireOptions shared(boolean shared) {
    return with(copy -> copy.shared = shared);
  }

  /** One of at most {@code permits} live leases of the key (a semaphore); 1 is exclusive. */
  public AcquireOptions permits(int permits) {
    return with(copy -> copy.permits = permits);
  }

  /**
   * The lease's token. A retried acquire must carry the same one, so that a retry after a lost
   * reply gets the lease that reply granted: {@link FenceClient} draws one before the first try.
   */
  public AcquireOptions token(UUID token) {
    return with(copy -> copy.token = token);
  }

  /**
   * Keep the key from every grant for this long after this lease ends other than by a release
   * (Consul's lock-delay; at most an hour). Zero, the default, for none.
   */
  public AcquireOptions lockDelay(Duration lockDelay) {
    Objects.requireNonNull(lockDelay, "lockDelay");
    return with(copy -> copy.lockDelay = lockDelay);
  }

  /** The same options with another ttl. */
  public AcquireOptions withTtl(Duration ttl) {
    Objects.requireNonNull(ttl, "ttl");
    return with(copy -> copy.ttl = ttl);
  }

  public Duration ttl() {
    return ttl;
  }

  public Optional<String> owner() {
    return Optional.ofNullable(owner);
  }

  public Duration waitTime() {
    return wait;
  }

  public boolean isSessionBound() {
    return sessionBound;
  }

  public boolean isDurable() {
    return durable;
  }

  public boolean isShared() {
    return shared;
  }

  public int permits() {
    return permits;
  }

  public Optional<UUID> token() {
    return Optional.ofNullable(token);
  }

  public Duration lockDelay() {
    return lockDelay;
  }

  /** These options with a token: their own, or a fresh random one. */
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
