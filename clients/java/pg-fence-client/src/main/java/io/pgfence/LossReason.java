package io.pgfence;

import java.util.Locale;

/**
 * Why a lease was lost, as every pg_fence client tells it: what the server's {@code
 * fence.lease_status} says once the server said the lease is not held (PF001 at a renewal, a stale
 * guard, a release that found nothing), or {@link #UNREACHABLE} when the client's own deadline
 * passed without an answer.
 */
public enum LossReason {
  /** Its TTL ran out without a renewal, and nobody has been granted the key since. */
  EXPIRED,
  /** {@code fence.lease_revoke} ended it. */
  REVOKED,
  /** Its TTL ran out and another holder was granted the key. */
  TAKEN_OVER,
  /** A session-bound lease whose session ended (or was lost to this client). */
  SESSION_ENDED,
  /**
   * A fast lease ({@code durable(false)}) lost in a crash or a failover of the server, which
   * reports it as {@code unknown}.
   */
  RESTARTED,
  /**
   * The local deadline passed with no answer from the server: it may still count the lease live,
   * for a moment.
   */
  UNREACHABLE,
  /** The server knows no more (the lease's row is gone, or the token never held the key). */
  UNKNOWN;

  /**
   * The name the server and the other clients use: {@code expired}, {@code revoked}, {@code
   * taken_over}, {@code session_ended}, {@code restarted}, {@code unreachable}, {@code unknown}.
   *
   * @return the constant's name in lower case
   */
  public String wireName() {
    return name().toLowerCase(Locale.ROOT);
  }

  /**
   * The reason of a name as {@link #wireName()} spells it.
   *
   * @param name a wire name, in any case; not null
   * @return the reason
   * @throws IllegalArgumentException when {@code name} names no reason
   */
  public static LossReason fromWireName(String name) {
    return valueOf(name.toUpperCase(Locale.ROOT));
  }

  /**
   * The reason of the server's {@code lease_status} reason for a lease that ended; a fast lease the
   * server forgot ({@code unknown}) is {@link #RESTARTED}. Null for {@code released} and for a live
   * lease (null reason).
   */
  static LossReason ofStatus(String serverReason, boolean durable) {
    if (serverReason == null || serverReason.equals("released")) {
      return null;
    }
    switch (serverReason) {
      case "expired":
        return EXPIRED;
      case "revoked":
        return REVOKED;
      case "taken_over":
        return TAKEN_OVER;
      case "session_ended":
        return SESSION_ENDED;
      case "restarted":
        return RESTARTED;
      default:
        return durable ? UNKNOWN : RESTARTED;
    }
  }

  @Override
  public String toString() {
    return wireName();
  }
}
