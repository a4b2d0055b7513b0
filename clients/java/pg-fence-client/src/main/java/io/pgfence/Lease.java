package io.pgfence;

import java.time.Instant;
import java.util.UUID;

/**
 * A granted lease. The {@code token} is the holder's secret that renew and release need; the {@code
 * fence} is what fenced writes compare (opaque: compare it, never compute with it).
 *
 * @param key the key
 * @param owner the owner label it was granted with (the session's application_name when none)
 * @param fence higher than every fence the key had before
 * @param token the holder's secret
 * @param acquiredAt when the server granted it
 * @param expiresAt when the server lets it expire, short of a renewal
 * @param durable a durable lease (the default), or a fast one
 * @param shared granted as a shared (reader's) lease
 * @param permits the permits it was granted under; 1 for an exclusive lease
 */
public record Lease(
    String key,
    String owner,
    long fence,
    UUID token,
    Instant acquiredAt,
    Instant expiresAt,
    boolean durable,
    boolean shared,
    int permits) {

  /**
   * This lease with another expiry, as a renewal returns it.
   *
   * @param expiry the server's new expiry of the lease
   * @return a copy with {@code expiresAt} set to {@code expiry}
   */
  public Lease withExpiresAt(Instant expiry) {
    return new Lease(key, owner, fence, token, acquiredAt, expiry, durable, shared, permits);
  }
}
