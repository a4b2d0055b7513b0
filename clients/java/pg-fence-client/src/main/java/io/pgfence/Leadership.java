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

  public KeptLease keptLease() {
    return kept;
  }

  public Lease lease() {
    return kept.lease();
  }

  public String key() {
    return kept.key();
  }

  /** The fence that fences the leader's writes. */
  public long fence() {
    return kept.fence();
  }

  /** The leader's value: the owner it was elected with, or last proclaimed. */
  public String value() {
    return value;
  }

  /** Whether it still leads (its lease held, by the local deadline too). */
  public boolean isLeader() {
    return kept.isHeld();
  }

  /** Completed with the reason when the lease is lost (a copy of the kept lease's). */
  public CompletableFuture<LossReason> lost() {
    return kept.lost();
  }

  /** Why the leadership ended, as {@code onStoppedLeading} was told; empty while it leads. */
  public Optional<StopReason> stoppedReason() {
    synchronized (told) {
      return Optional.ofNullable(stopReason);
    }
  }

  /** {@link KeptLease#guard(Connection)}: refused once another leader is elected. */
  public void guard(Connection conn) throws SQLException {
    kept.guard(conn);
  }

  /** {@link KeptLease#fencedUpdate}. */
  public long fencedUpdate(
      Connection conn, String table, Map<String, ?> changes, Map<String, ?> filter)
      throws SQLException {
    return kept.fencedUpdate(conn, table, changes, filter);
  }

  /**
   * Changes the value observers see, keeping the fence ({@code fence.lease_proclaim}). {@link
   * LeaseLostException} (with its reason) when it no longer leads.
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
   * changing nothing, when no such candidate waits. {@link LeaseLostException} when it no longer
   * leads.
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
    call(options.onStoppedLeading(), reason);
  }

  private static <T> void call(Consumer<T> callback, T argument) {
    if (callback == null) {
      return;
    }
    try {
      callback.accept(argument);
    } catch (RuntimeException ignored) {
      // A callback's failure is its own.
    }
  }

  @Override
  public String toString() {
    return "Leadership[" + kept.key() + ", " + value + ", fence " + kept.fence() + "]";
  }
}
