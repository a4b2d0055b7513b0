package io.pgfence;

import java.util.Optional;

/**
 * {@code PF001}: the token no longer holds the key's live lease (a renewal, a proclaim, a kept
 * lease's {@code guard} once its lease is no longer held). Stop the work done under that lease.
 */
public class LeaseLostException extends PgFenceException {
  private static final long serialVersionUID = 1L;

  /** The key (a set's keys, comma-separated). */
  private final String key;

  private final transient LossReason reason;

  /**
   * @param key the key (a set's keys, comma-separated)
   * @param reason why, when it was asked of the server (or known locally); null otherwise
   * @param cause the server's error, if any
   */
  public LeaseLostException(String key, LossReason reason, Throwable cause) {
    super(
        "lease lost: " + key + (reason == null ? "" : " (" + reason.wireName() + ")"),
        "PF001",
        cause);
    this.key = key;
    this.reason = reason;
  }

  /**
   * The key of the lease lost.
   *
   * @return the key; a set's keys, comma-separated
   */
  public String key() {
    return key;
  }

  /**
   * Why the lease was lost: present from {@link FenceClient} and kept leases, which ask {@code
   * lease_status} after the PF001; empty from the one-statement {@link PgFence#renew}.
   *
   * @return the reason; empty when nobody asked the server
   */
  public Optional<LossReason> reason() {
    return Optional.ofNullable(reason);
  }
}
