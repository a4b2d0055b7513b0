package io.pgfence.shedlock;

import io.pgfence.FenceClient;
import io.pgfence.Lease;
import io.pgfence.LeaseLostException;
import io.pgfence.PgFence;
import java.sql.Connection;
import java.sql.SQLException;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.Deque;
import java.util.Optional;
import java.util.OptionalLong;
import net.javacrumbs.shedlock.core.AbstractSimpleLock;
import net.javacrumbs.shedlock.core.ClockProvider;
import net.javacrumbs.shedlock.core.LockConfiguration;
import net.javacrumbs.shedlock.core.SimpleLock;
import net.javacrumbs.shedlock.support.LockException;

/**
 * A ShedLock lock held as a pg_fence lease. While its task runs, {@link #current()} and {@link
 * #currentFence()} give it on the task's thread (ShedLock runs the task on the thread that took the
 * lock), so that the task can guard its writes:
 *
 * <pre>{@code
 * @Scheduled(cron = "0 0 * * * *")
 * @SchedulerLock(name = "nightly-report", lockAtMostFor = "10m")
 * void nightlyReport() throws SQLException {
 *   try (Connection conn = dataSource.getConnection()) {
 *     conn.setAutoCommit(false);
 *     PgFenceLock.current().orElseThrow().guard(conn);   // StaleFenceException once taken over
 *     conn.createStatement().executeUpdate("INSERT INTO reports ...");
 *     conn.commit();
 *   }
 * }
 * }</pre>
 */
public final class PgFenceLock extends AbstractSimpleLock {
  private static final ThreadLocal<Deque<PgFenceLock>> ACTIVE =
      ThreadLocal.withInitial(ArrayDeque::new);

  private final FenceClient client;
  private final Lease lease;

  private PgFenceLock(FenceClient client, LockConfiguration config, Lease lease) {
    super(config);
    this.client = client;
    this.lease = lease;
  }

  /** A lock just granted, made this thread's current one. */
  static PgFenceLock started(FenceClient client, LockConfiguration config, Lease lease) {
    PgFenceLock lock = new PgFenceLock(client, config, lease);
    ACTIVE.get().push(lock);
    return lock;
  }

  /** The lock of the task running on this thread (the innermost, when tasks nest). */
  public static Optional<PgFenceLock> current() {
    return Optional.ofNullable(ACTIVE.get().peek());
  }

  /** The fence of the task running on this thread; empty outside a task. */
  public static OptionalLong currentFence() {
    PgFenceLock lock = ACTIVE.get().peek();
    return lock == null ? OptionalLong.empty() : OptionalLong.of(lock.fence());
  }

  public Lease lease() {
    return lease;
  }

  public String key() {
    return lease.key();
  }

  /** The fence to guard the task's writes with. */
  public long fence() {
    return lease.fence();
  }

  /**
   * The server's guard in the caller's transaction on {@code conn} (not autocommit): returns when
   * this lock's fence is still the key's live one, else {@link io.pgfence.StaleFenceException}.
   */
  public void guard(Connection conn) throws SQLException {
    PgFence.fenceGuard(conn, lease.key(), lease.fence());
  }

  /**
   * Ends the lock: released at once, or, before {@code lockAtLeastFor} has passed, renewed to run
   * out then (as ShedLock defines {@code lockAtLeastFor}).
   */
  @Override
  protected void doUnlock() {
    ACTIVE.get().remove(this);
    Duration left = Duration.between(ClockProvider.now(), lockConfiguration.getLockAtLeastUntil());
    try {
      if (left.isNegative() || left.isZero()) {
        client.release(lease);
      } else {
        client.renew(lease, left);
      }
    } catch (LeaseLostException lost) {
      // Expired or taken over already: nothing of ours to end.
    } catch (SQLException e) {
      throw new LockException("pg_fence: could not unlock " + lease.key(), e);
    }
  }

  /**
   * Renews the lease for the new {@code lockAtMostFor}: the new lock, or empty when the lease was
   * lost meanwhile (expired, taken over, revoked).
   */
  @Override
  protected Optional<SimpleLock> doExtend(LockConfiguration config) {
    try {
      client.renew(lease, config.getLockAtMostFor());
    } catch (LeaseLostException lost) {
      ACTIVE.get().remove(this);
      return Optional.empty();
    } catch (SQLException e) {
      throw new LockException("pg_fence: could not extend " + lease.key(), e);
    }
    PgFenceLock extended = new PgFenceLock(client, config, lease);
    Deque<PgFenceLock> active = ACTIVE.get();
    if (active.remove(this)) {
      active.push(extended);
    }
    return Optional.of(extended);
  }
}
