package io.pgfence;

import java.sql.Connection;
import java.sql.SQLException;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.function.Consumer;

/**
 * A leader's kept lease ({@link #keptLease()}: renewed in the background, told lost the moment it
 * is), with its value, proclaim, hand-off and resign. {@code onStoppedLeading} is told once, after
 * {@code onStartedLeading}, when it ends. {@link #close()} resigns.
 */
public final class Leadership implements AutoCloseable {
  private final FenceClient client;
  private final ElectorOptions options;
  private final KeptLease kept;
  private volatile String value;
  private final Object told = new Object();
  private boolean startedTold; // guarded by told
  private StopReason stopReason; // guarded by told
  private boolean stopTold; // guarded by told

  Leadership(FenceClient client, ElectorOptions options, KeptLease kept, String value) {
    this.client = client;
    this.options = options;
    this.kept = kept;
    this.value = value;
  }

  /**
   * The leader's kept lease.
   *
   * @return the kept lease, renewed in the background while it leads
   */
  public KeptLease keptLease() {
    return kept;
  }

  /**
   * The leader's lease.
   *
   * @return the lease, with the server's expiry after the last renewal
   */
  public Lease lease() {
    return kept.lease();
  }

  /**
   * The elected key.
   *
   * @return the key the candidates share
   */
  public String key() {
    return kept.key();
  }

  /**
   * The fence that fences the leader's writes.
   *
   * @return the leadership lease's fence, higher than every earlier leader's
   */
  public long fence() {
    return kept.fence();
  }

  /**
   * The leader's value: the owner it was elected with, or last proclaimed.
   *
   * @return the value observers see
   */
  public String value() {
    return value;
  }

  /**
   * Whether it still leads (its lease held, by the local deadline too).
   *
   * @return true while the kept lease is held
   */
  public boolean isLeader() {
    return kept.isHeld();
  }

  /**
   * Completed with the reason when the lease is lost (a copy of the kept lease's).
   *
   * @return a new future of the loss; cancelled when the leadership ends otherwise
   */
  public CompletableFuture<LossReason> lost() {
    return kept.lost();
  }

  /**
   * Why the leadership ended, as {@code onStoppedLeading} was told.
   *
   * @return the reason; empty while it leads
   */
  public Optional<StopReason> stoppedReason() {
    synchronized (told) {
      return Optional.ofNullable(stopReason);
    }
  }

  /**
   * {@link KeptLease#guard(Connection)}: refused once another leader is elected.
   *
   * @param conn the connection of the transaction to guard (not autocommit)
   * @throws LeaseLostException when the leadership is already known lost, before asking the server
   * @throws StaleFenceException when the server refuses the fence: roll back
   * @throws SQLException the driver's, when the guard could not be run
   */
  public void guard(Connection conn) throws SQLException {
    kept.guard(conn);
  }

  /**
   * {@link KeptLease#fencedUpdate}: the update under the leader's fence, in one statement.
   *
   * @param conn the connection to write on (in autocommit or in the caller's transaction)
   * @param table the table to update, as SQL names it ({@code "billing.invoices"})
   * @param changes the new values by column name; not empty
   * @param filter the rows to update: column name to the value it must equal (all of them); not
   *     empty, no null value
   * @return the number of rows updated; 0 when none matched
   * @throws LeaseLostException when the leadership is already known lost, before asking the server
   * @throws StaleFenceException when the server refuses the fence: nothing was written
   * @throws SQLException the server's, for a bad table, column or value
   */
  public long fencedUpdate(
      Connection conn, String table, Map<String, ?> changes, Map<String, ?> filter)
      throws SQLException {
    return kept.fencedUpdate(conn, table, changes, filter);
  }

  /**
   * Changes the value observers see, keeping the fence ({@code fence.lease_proclaim}).
   *
   * @param newValue the new value (the lease's owner), at most 256 bytes in UTF-8
   * @throws LeaseLostException with its reason, when it no longer leads
   * @throws SQLException when the server could not be asked, or refused the value
   */
  public void proclaim(String newValue) throws SQLException {
    kept.check();
    kept.renewing().lock();
    try {
      if (client.proclaim(kept.lease(), newValue)) {
        value = newValue;
        return;
      }
      kept.lostByServer();
      throw new LeaseLostException(kept.key(), kept.reason().orElse(null), null);
    } finally {
      kept.renewing().unlock();
    }
  }

  /**
   * For a rolling update: ends this leadership and hands the key, with a higher fence, to the
   * candidate campaigning with the value {@code toOwner}, ahead of the others in line ({@code
   * fence.lease_handoff}): the new leader ({@code onStoppedLeading}: {@code handed_off}); empty,
   * changing nothing, when no such candidate waits.
   *
   * @param toOwner the value of the candidate to hand to, as it campaigns; not empty
   * @return the new leader; empty, with this leadership unchanged, when no such candidate waits
   * @throws LeaseLostException with its reason, when it no longer leads
   * @throws SQLException when the server could not be asked, or refused the hand-off
   */
  public Optional<Leader> handoff(String toOwner) throws SQLException {
    kept.check();
    kept.renewing().lock();
    try {
      Optional<Leader> next = client.handoff(kept.lease(), toOwner);
      if (next.isEmpty()) {
        String ended = client.endedBy(List.of(kept.key()), kept.token(), kept.timeout());
        if (ended == null) {
          return Optional.empty(); // still ours: nothing changed
        }
        if (!ended.equals("released")) {
          kept.lostByServer();
          throw new LeaseLostException(kept.key(), kept.reason().orElse(null), null);
        }
        // A retry after a hand-off whose answer was lost: it happened. Who leads now:
        next = client.leader(kept.key());
      }
      kept.abandon(KeptLease.State.RELEASED);
      stopped(StopReason.HANDED_OFF);
      return next;
    } finally {
      kept.renewing().unlock();
    }
  }

  /**
   * Releases the leadership: true when the server said so ({@code onStoppedLeading}: {@code
   * released}); false when it had ended already ({@code onStoppedLeading} told why).
   *
   * @return true when this call's release ended the lease
   */
  public boolean resign() {
    boolean released = kept.release();
    stopped(
        kept.state() == KeptLease.State.RELEASED
            ? StopReason.RELEASED
            : StopReason.lost(kept.reason().orElse(LossReason.UNKNOWN)));
    return released;
  }

  /** {@link #resign()}. */
  @Override
  public void close() {
    resign();
  }

  /** The elector was closed: resign, or leave the lease to expire at its TTL. */
  void cancelled() {
    if (options.releaseOnCancel()) {
      resign();
      return;
    }
    kept.abandon(KeptLease.State.UNKNOWN);
    stopped(StopReason.CANCELLED);
  }

  /** onStartedLeading, then onStoppedLeading if it ended meanwhile. */
  void started() {
    client.observers().leadershipGained(kept.key());
    call(options.onStartedLeading(), this);
    synchronized (told) {
      startedTold = true;
    }
    if (!kept.isHeld()) {
      stopped(StopReason.lost(kept.reason().orElse(LossReason.UNKNOWN)));
    }
    tellStop();
  }

  /** The leadership ended, for {@code reason}: told once, after the start. */
  void stopped(StopReason reason) {
    synchronized (told) {
      if (stopReason == null) {
        stopReason = reason;
      }
    }
    tellStop();
  }

  private void tellStop() {
    StopReason reason;
    synchronized (told) {
      if (!startedTold || stopReason == null || stopTold) {
        return;
      }
      stopTold = true;
      reason = stopReason;
    }
    client.observers().leadershipLost(kept.key());
    call(options.onStoppedLeading(), reason);
  }

  private static <T> void call(Consumer<T> callback, T argument) {
    if (callback == null) {
      return;
    }
    Callbacks.run(() -> callback.accept(argument));
  }

  @Override
  public String toString() {
    return "Leadership[" + kept.key() + ", " + value + ", fence " + kept.fence() + "]";
  }
}
