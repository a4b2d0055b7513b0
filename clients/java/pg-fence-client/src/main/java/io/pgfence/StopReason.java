package io.pgfence;

import java.util.Optional;

/**
 * Why a leadership ended, as {@code onStoppedLeading} is told: the lease was lost (for a {@link
 * LossReason}), released by {@code resign}, handed off to another candidate, or left to expire when
 * cancelled without release. {@link #wireName()} is the name the other clients use.
 *
 * @param wireName {@code released}, {@code handed_off}, {@code cancelled}, or the loss reason's
 * @param loss the loss reason, for a lost lease
 */
public record StopReason(String wireName, LossReason loss) {
  /** Resigned (or closed): the server said the release ended the lease. */
  public static final StopReason RELEASED = new StopReason("released", null);

  /** Handed off to another candidate. */
  public static final StopReason HANDED_OFF = new StopReason("handed_off", null);

  /** Cancelled without release: the lease is left to expire at its TTL. */
  public static final StopReason CANCELLED = new StopReason("cancelled", null);

  /**
   * Lost, for {@code reason}.
   *
   * @param reason why the lease was lost; not null
   * @return a stop reason named as {@code reason}
   */
  public static StopReason lost(LossReason reason) {
    return new StopReason(reason.wireName(), reason);
  }

  /**
   * The loss's reason when the lease was lost.
   *
   * @return the reason; empty when the lease was released, handed off or cancelled
   */
  public Optional<LossReason> lossReason() {
    return Optional.ofNullable(loss);
  }

  @Override
  public String toString() {
    return wireName;
  }
}
