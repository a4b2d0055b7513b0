package io.pgfence;

/**
 * Told once when a kept lease is lost while held: the server said so (with the reason {@code
 * lease_status} gives), or the local deadline passed without an answer ({@link
 * LossReason#UNREACHABLE}). Called from the thread that found out (the keeper's, the deadline's
 * timer, or the holder's own when {@code isHeld()} or {@code guard} found it): keep it short. One
 * that throws (an Error too, but the JVM's own) fails alone: the client goes on.
 */
@FunctionalInterface
public interface LeaseListener {
  /**
   * The lease is lost.
   *
   * @param lease the kept lease, no longer held
   * @param reason why
   */
  void onLost(KeptLease lease, LossReason reason);
}
