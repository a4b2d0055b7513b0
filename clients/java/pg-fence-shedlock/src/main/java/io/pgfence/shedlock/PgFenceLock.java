package io.pgfence.shedlock;

import io.pgfence.FenceClient;
import io.pgfence.KeptLease;
import io.pgfence.Lease;
import io.pgfence.LeaseLostException;
import io.pgfence.LossReason;
import io.pgfence.PgFence;
import io.pgfence.StaleFenceException;
import java.sql.Connection;
import java.sql.SQLException;
import java.time.Duration;
import java.time.Instant;
import java.time.temporal.ChronoUnit;
import java.util.ArrayDeque;
import java.util.Deque;
import java.util.Optional;
import java.util.OptionalLong;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import net.javacrumbs.shedlock.core.AbstractSimpleLock;
import net.javacrumbs.shedlock.core.ClockProvider;
import net.javacrumbs.shedlock.core.LockConfiguration;
import net.javacrumbs.shedlock.core.SimpleLock;
import net.javacrumbs.shedlock.support.LockException;

/**
 * A ShedLock lock held as a pg_fence lease. While its task runs, {@link #current()} and {@link
 * #currentFence()} give it on the task's thread (ShedLock runs the task on the thread that took the
 * lock), so that the task can guard its writes and learn that its lock is gone ({@link #isHeld()},
 * {@link #reason()}, {@link #lost()}):
 *
 * <pre>{@code
 * @Scheduled(cron = "0 0 * * * *")
 * @SchedulerLock(name = "nightly-report", lockAtMostFor = "10m")
 * void nightlyReport() throws SQLException {
 *   PgFenceLock lock = PgFenceLock.current().orElseThrow();
 *   for (Batch batch : batches()) {
 *     lock.check();                                      // LeaseLostException once gone
 *     try (Connection conn = dataSource.getConnection()) {
 *       conn.setAutoCommit(false);
 *       lock.guard(conn);                                // StaleFenceException once taken over
 *       conn.createStatement().executeUpdate("INSERT INTO reports ...");
 *       conn.commit();
 *     }
 *   }
 * }
 * }</pre>
 *
 * <p>Without renewal (the default) the lock is held until {@code lockAtMostFor} runs out: it is
 * then lost ({@link LossReason#EXPIRED}), whether or not another instance takes it, and the server
 * refuses its guarded writes. A loss the server finds earlier (a revoke) is learnt at the next
 * guarded write. With {@link PgFenceLockProvider.Builder#keepAlive(boolean)} the lock is a {@link
 * KeptLease} renewed while the task runs, and a loss (revoked, taken over after a failed renewal,
 * the server out of reach) is told the moment the client learns it.
 */
public final class PgFenceLock extends AbstractSimpleLock {
  private static final ThreadLocal<Deque<PgFenceLock>> ACTIVE =
      ThreadLocal.withInitial(ArrayDeque::new);

  private final Hold hold;

  private PgFenceLock(LockConfiguration config, Hold hold) {
    super(config);
    this.hold = hold;
  }

  /** A lock just granted (sent at {@code sentNanos}), made this thread's current one. */
  static PgFenceLock started(
      FenceClient client, LockConfiguration config, Lease lease, long sentNanos) {
    Hold hold = new Hold(client, lease, null);
    hold.renewed(sentNanos, config.getLockAtMostFor());
    return push(new PgFenceLock(config, hold));
  }

  /** A lock kept by the client's keeper, made this thread's current one. */
  static PgFenceLock kept(FenceClient client, LockConfiguration config, KeptLease kept) {
    return push(new PgFenceLock(config, new Hold(client, kept.lease(), kept)));
  }

  private static PgFenceLock push(PgFenceLock lock) {
    ACTIVE.get().push(lock);
    return lock;
  }

  /**
   * The lock of the task running on this thread (the innermost, when tasks nest).
   *
   * @return the lock; empty outside a task
   */
  public static Optional<PgFenceLock> current() {
    return Optional.ofNullable(ACTIVE.get().peek());
  }

  /**
   * The fence of the task running on this thread.
   *
   * @return the fence; empty outside a task
   */
  public static OptionalLong currentFence() {
    PgFenceLock lock = ACTIVE.get().peek();
    return lock == null ? OptionalLong.empty() : OptionalLong.of(lock.fence());
  }

  /**
   * The lease as granted.
   *
   * @return the lease: key, token, fence
   */
  public Lease lease() {
    return hold.lease;
  }

  /**
   * The kept lease when the provider renews its locks ({@link
   * PgFenceLockProvider.Builder#keepAlive(boolean)}).
   *
   * @return the kept lease; empty without renewal
   */
  public Optional<KeptLease> keptLease() {
    return Optional.ofNullable(hold.kept);
  }

  /**
   * The lease's key.
   *
   * @return the provider's prefix and the lock's name
   */
  public String key() {
    return hold.lease.key();
  }

  /**
   * The fence to guard the task's writes with.
   *
   * @return the lease's fence
   */
  public long fence() {
    return hold.lease.fence();
  }

  /**
   * Whether the lock is still held: false once {@code lockAtMostFor} has run out without renewal
   * (judged from {@link System#nanoTime()}, less a margin for the clocks), once a guarded write was
   * refused, once a kept lock is lost, and once unlocked.
   *
   * @return true while held
   */
  public boolean isHeld() {
    return hold.isHeld();
  }

  /**
   * Why the lock was lost.
   *
   * @return the reason; empty while held and once unlocked
   */
  public Optional<LossReason> reason() {
    return hold.reason();
  }

  /**
   * Completed with the reason the moment the lock is lost while its task runs; cancelled when the
   * task unlocks it first. A copy: completing or cancelling it changes nothing here. Its callbacks
   * run on the thread that found the loss (a timer, the keeper's): keep them short. A lock found
   * past its {@code lockAtMostFor} while an extension was in flight is held again once the server
   * confirms the extension: a future taken before says {@code EXPIRED}, the next one waits anew.
   *
   * @return the future of the loss
   */
  public CompletableFuture<LossReason> lost() {
    return hold.lost();
  }

  /**
   * Returns when the lock is held, so that a task can stop between steps.
   *
   * @throws LeaseLostException with the reason once it is not
   */
  public void check() throws LeaseLostException {
    if (!isHeld()) {
      throw new LeaseLostException(key(), reason().orElse(null), null);
    }
  }

  /**
   * The server's guard in the caller's transaction on {@code conn} (not autocommit): returns when
   * this lock's fence is still the key's live one. A refusal also makes the lock lost, with the
   * reason the server gives.
   *
   * @param conn the connection of the transaction to guard
   * @throws StaleFenceException when the server refuses the fence: roll back
   * @throws LeaseLostException a kept lock already known lost, before asking the server
   * @throws SQLException the driver's, when the guard could not be run
   */
  public void guard(Connection conn) throws SQLException {
    if (hold.kept != null) {
      hold.kept.guard(conn);
      return;
    }
    try {
      PgFence.fenceGuard(conn, hold.lease.key(), hold.lease.fence());
    } catch (StaleFenceException stale) {
      hold.refused();
      throw stale;
    }
  }

  /**
   * What is left of {@code lockAtLeastFor} at unlock below which the lease is released rather than
   * renewed. {@link ClockProvider#now()} is truncated to the millisecond, so the time left measured
   * with it overstates the true one by up to 1 ms: a configuration created at {@code Instant.now()}
   * with no {@code lockAtLeastFor} would otherwise be renewed for its sub-millisecond, refusing an
   * immediate re-lock, or for a time that rounds to 0, which the server refuses.
   */
  static final Duration RELEASE_BELOW = Duration.ofMillis(2);

  /**
   * Ends the lock: released at once, or, when more than {@link #RELEASE_BELOW} of {@code
   * lockAtLeastFor} is left, renewed to run out then (as ShedLock defines {@code lockAtLeastFor}).
   * A kept lock stops being renewed first.
   */
  @Override
  protected void doUnlock() {
    ACTIVE.get().remove(this);
    Duration left = keepFor(lockConfiguration.getLockAtLeastUntil(), ClockProvider.now());
    hold.unlock(left);
  }

  /**
   * How long an unlock at {@code now} renews the lease for to keep it until {@code atLeastUntil},
   * at the server's precision (microseconds); zero to release it: when what is left is under {@link
   * #RELEASE_BELOW}, never a renewal for a non-positive time.
   */
  static Duration keepFor(Instant atLeastUntil, Instant now) {
    Duration left = Duration.between(now, atLeastUntil).truncatedTo(ChronoUnit.MICROS);
    return left.compareTo(RELEASE_BELOW) < 0 ? Duration.ZERO : left;
  }

  /**
   * Renews the lease for the new {@code lockAtMostFor} (a kept lock, which its keeper renews
   * anyway, only when still held): the new lock, or empty when the lease was lost meanwhile
   * (expired, taken over, revoked).
   */
  @Override
  protected Optional<SimpleLock> doExtend(LockConfiguration config) {
    if (!hold.extend(config.getLockAtMostFor())) {
      ACTIVE.get().remove(this);
      return Optional.empty();
    }
    PgFenceLock extended = new PgFenceLock(config, hold);
    Deque<PgFenceLock> active = ACTIVE.get();
    if (active.remove(this)) {
      active.push(extended);
    }
    return Optional.of(extended);
  }

  /** What a lock and its extensions share: the lease, and what became of it. */
  private static final class Hold {
    private final FenceClient client;
    private final Lease lease;

    /** The kept lease with renewal; null without, when the fields below tell the state. */
    private final KeptLease kept;

    private CompletableFuture<LossReason> lost = new CompletableFuture<>(); // guarded by this
    private long deadlineNanos; // guarded by this
    private LossReason reason; // guarded by this
    private long expiredAtNanos; // guarded by this: when the deadline was found passed
    private boolean unlocked; // guarded by this

    Hold(FenceClient client, Lease lease, KeptLease kept) {
      this.client = client;
      this.lease = lease;
      this.kept = kept;
    }

    /**
     * A grant or renewal for {@code ttl}, sent at {@code sentNanos}: the server counts the TTL from
     * later, so the lease is held until then plus the TTL, less a margin for clocks that run at
     * different rates (as the client's kept leases take: max(ttl/1000, min(ttl/50, 100 ms))).
     */
    void renewed(long sentNanos, Duration ttl) {
      long nanos = ttl.toNanos();
      long margin =
          Math.max(nanos / 1000, Math.min(nanos / 50, TimeUnit.MILLISECONDS.toNanos(100)));
      long deadline = sentNanos + nanos - margin;
      synchronized (this) {
        deadlineNanos = deadline;
        // The old deadline passed while this renewal was in flight: the server renewed the lease,
        // which it does only for a live one of this token, so it was held throughout.
        if (reason == LossReason.EXPIRED && !unlocked && expiredAtNanos - sentNanos >= 0) {
          reason = null;
          lost = new CompletableFuture<>();
        }
      }
      long delay = Math.max(0, deadline - System.nanoTime());
      CompletableFuture.delayedExecutor(delay, TimeUnit.NANOSECONDS).execute(this::isHeld);
    }

    boolean isHeld() {
      if (kept != null) {
        return kept.isHeld();
      }
      LossReason why;
      CompletableFuture<LossReason> told;
      synchronized (this) {
        if (unlocked || reason != null) {
          return false;
        }
        long now = System.nanoTime();
        if (now - deadlineNanos < 0) {
          return true;
        }
        reason = why = LossReason.EXPIRED;
        expiredAtNanos = now;
        told = lost;
      }
      told.complete(why);
      return false;
    }

    Optional<LossReason> reason() {
      if (kept != null) {
        return kept.reason();
      }
      isHeld();
      synchronized (this) {
        return Optional.ofNullable(reason);
      }
    }

    CompletableFuture<LossReason> lost() {
      if (kept != null) {
        return kept.lost();
      }
      CompletableFuture<LossReason> copy = new CompletableFuture<>();
      CompletableFuture<LossReason> current;
      synchronized (this) {
        current = lost;
      }
      current.whenComplete(
          (why, error) -> {
            if (error == null) {
              copy.complete(why);
            } else {
              copy.cancel(false);
            }
          });
      return copy;
    }

    /** The server refused the fence: lost, for the reason lease_status gives. */
    void refused() {
      LossReason why;
      try {
        why = client.status(lease.key(), lease.token()).lossReason(lease.durable()).orElse(null);
      } catch (SQLException e) {
        why = null;
      }
      lostFor(why == null ? LossReason.UNKNOWN : why);
    }

    private void lostFor(LossReason why) {
      CompletableFuture<LossReason> told;
      synchronized (this) {
        if (unlocked || reason != null) {
          return;
        }
        reason = why;
        told = lost;
      }
      told.complete(why);
    }

    boolean extend(Duration ttl) {
      if (kept != null) {
        return kept.isHeld();
      }
      long sent = System.nanoTime();
      try {
        client.renew(lease, ttl);
      } catch (LeaseLostException gone) {
        lostFor(gone.reason().orElse(LossReason.UNKNOWN));
        return false;
      } catch (SQLException e) {
        throw new LockException("pg_fence: could not extend " + lease.key(), e);
      }
      renewed(sent, ttl);
      return true;
    }

    /** Ends the lease, or leaves it for {@code keep} (not zero) and then to run out. */
    void unlock(Duration keep) {
      CompletableFuture<LossReason> told;
      synchronized (this) {
        unlocked = true;
        told = lost;
      }
      told.cancel(false);
      if (kept != null && keep.isZero()) {
        kept.release();
        if (kept.state() == KeptLease.State.UNKNOWN) {
          throw new LockException(
              "pg_fence: could not release "
                  + lease.key()
                  + " (no answer within the keep timeout): it ends at its lockAtMostFor");
        }
        return;
      }
      if (kept != null) {
        kept.stopRenewing();
      }
      try {
        if (keep.isZero()) {
          client.release(lease);
        } else {
          client.renew(lease, keep);
        }
      } catch (LeaseLostException lost) {
        // Expired or taken over already: nothing of ours to end.
      } catch (SQLException e) {
        throw new LockException("pg_fence: could not unlock " + lease.key(), e);
      }
    }
  }
}
