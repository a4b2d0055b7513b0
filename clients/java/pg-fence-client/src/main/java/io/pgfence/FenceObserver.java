package io.pgfence;

import java.time.Duration;

/**
 * Told what a {@link FenceClient} does, for metrics: acquires and the keeper's renewals with how
 * long they took, kept leases starting and ending, losses with their reason, leaderships gained and
 * lost. Every method does nothing unless overridden. Added with {@link
 * FenceClient#addObserver(FenceObserver)}; {@code pg-fence-micrometer}'s {@code PgFenceMetrics} is
 * one.
 *
 * <p>Called on the thread that did the work (the caller's, the keeper's, a timer's), once the
 * client's locks and the renewal's connection are given back: an observer that blocks holds up no
 * other lease's renewal and no {@link KeptLease#stopRenewing()}, but it holds its thread (a
 * session-bound lease's own renewals wait for it), so keep each call short. A method that throws
 * (an {@link Error} too, but a {@link VirtualMachineError}) is ignored: the client goes on.
 */
public interface FenceObserver {
  /** How an acquire ended. */
  enum AcquireOutcome {
    /** The lease was granted. */
    GRANTED,
    /** The key was held by others (after the wait, if any). */
    REFUSED,
    /** The acquire threw: the server could not be reached, or it refused the call. */
    ERROR;

    /**
     * The lowercase name, as metrics tag it.
     *
     * @return {@code granted}, {@code refused} or {@code error}
     */
    public String tagValue() {
      return name().toLowerCase(java.util.Locale.ROOT);
    }
  }

  /** How one renewal call of the keeper ended. */
  enum RenewOutcome {
    /** Every lease of the call was renewed. */
    OK,
    /** The server said at least one lease of the call was no longer held. */
    LOST,
    /** The call failed (no answer, a broken connection): it is tried again while time is left. */
    ERROR;

    /**
     * The lowercase name, as metrics tag it.
     *
     * @return {@code ok}, {@code lost} or {@code error}
     */
    public String tagValue() {
      return name().toLowerCase(java.util.Locale.ROOT);
    }
  }

  /**
   * An acquire ended: {@link FenceClient#acquire}, and the acquire of every kept lease ({@link
   * FenceClient#hold} and the others, an elector's campaign), retries included.
   *
   * @param took from the call to its end, waiting for the key included
   * @param outcome granted, refused or error
   */
  default void acquireFinished(Duration took, AcquireOutcome outcome) {}

  /**
   * A renewal of kept leases ended: one call of the keeper (which renews up to 64 leases in one
   * call), or one renewal of a session-bound lease.
   *
   * @param took the call's time, the connection's setup included
   * @param outcome ok, lost or error
   * @param leases how many kept leases the call renewed (a set counts once)
   */
  default void renewFinished(Duration took, RenewOutcome outcome, int leases) {}

  /**
   * A kept lease was granted and is kept from now on.
   *
   * @param lease the kept lease
   */
  default void keptLeaseStarted(KeptLease lease) {}

  /**
   * A kept lease is kept no more: lost, released, or left to expire. Told once, after {@link
   * #keptLeaseStarted}.
   *
   * @param lease the kept lease
   */
  default void keptLeaseEnded(KeptLease lease) {}

  /**
   * A kept lease was lost while held (as {@link LeaseListener} is told), or its holder's release
   * found it lost already.
   *
   * @param lease the kept lease
   * @param reason why, as the server (or the local deadline) tells it
   */
  default void leaseLost(KeptLease lease, LossReason reason) {}

  /**
   * An {@link Elector}'s campaign won: this client leads {@code election} now.
   *
   * @param election the elector's key
   */
  default void leadershipGained(String election) {}

  /**
   * A leadership this client had ended (resigned, lost, handed off or cancelled). Told once, after
   * {@link #leadershipGained}.
   *
   * @param election the elector's key
   */
  default void leadershipLost(String election) {}
}
