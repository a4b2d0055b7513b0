package io.pgfence.spring;

import io.pgfence.AcquireOptions;
import io.pgfence.FenceClient;
import io.pgfence.KeepOptions;
import io.pgfence.KeptLease;
import io.pgfence.LeaseLostException;
import io.pgfence.LossReason;
import io.pgfence.PgFence;
import io.pgfence.WaitTimedOutException;
import java.sql.Connection;
import java.sql.SQLException;
import java.time.Duration;
import java.util.ConcurrentModificationException;
import java.util.Objects;
import java.util.Optional;
import java.util.OptionalLong;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;
import javax.sql.DataSource;
import org.springframework.dao.CannotAcquireLockException;
import org.springframework.integration.support.locks.DistributedLock;
import org.springframework.integration.support.locks.ExpirableLockRegistry;
import org.springframework.integration.support.locks.RenewableLockRegistry;

/**
 * A Spring Integration {@link RenewableLockRegistry} on pg_fence leases. {@link #obtain(Object)}
 * gives one {@link FencedLock} per key in this registry: a {@link java.util.concurrent.locks.Lock}
 * (reentrant, held by one thread here, and by one registry among all that share the database) whose
 * hold is a kept lease of the key {@code prefix + key}, renewed in the background every ttl/3 and
 * told lost the moment it is. Its holder can read the lease's fence ({@link FencedLock#fence()})
 * and guard its writes with it ({@link FencedLock#guard(Connection)}), which no other JDBC lock
 * registry offers: a holder that hung past its TTL while another took over is refused at its next
 * guarded write.
 *
 * <pre>{@code
 * @Bean
 * PgFenceLockRegistry lockRegistry(DataSource dataSource) {
 *   return new PgFenceLockRegistry(dataSource);
 * }
 *
 * @Bean
 * LockRegistryLeaderInitiator leaderInitiator(PgFenceLockRegistry registry) {
 *   return new LockRegistryLeaderInitiator(registry);
 * }
 * }</pre>
 *
 * <p>{@code tryLock(time, unit)} waits on the server ({@code lease_acquire} with {@code wait}),
 * woken by the holder's release, not by polling. {@code unlock()} releases the lease; when the
 * lease was lost meanwhile it throws {@link ConcurrentModificationException} with the reason, as
 * Spring's {@code JdbcLockRegistry} does for an expired lock. {@code renewLock} renews at once (the
 * keeper renews anyway).
 */
public final class PgFenceLockRegistry
    implements RenewableLockRegistry<PgFenceLockRegistry.FencedLock>,
        ExpirableLockRegistry<PgFenceLockRegistry.FencedLock> {
  private final FenceClient client;
  private final String prefix;
  private final Duration ttl;
  private final KeepOptions keep;
  private final ConcurrentHashMap<String, FencedLock> locks = new ConcurrentHashMap<>();

  /** A registry on {@code dataSource}: keys {@code spring:<key>}, a TTL of 30 s. */
  public PgFenceLockRegistry(DataSource dataSource) {
    this(new FenceClient(dataSource), "spring:", Duration.ofSeconds(30), KeepOptions.defaults());
  }

  /**
   * @param client the client whose DataSource and retries the locks use
   * @param prefix put before each key
   * @param ttl each lock's lease TTL: how long a holder that hangs keeps the key from others
   * @param keep how the leases are kept (renewal period, margin, a listener told of each loss)
   */
  public PgFenceLockRegistry(FenceClient client, String prefix, Duration ttl, KeepOptions keep) {
    this.client = Objects.requireNonNull(client);
    this.prefix = Objects.requireNonNull(prefix);
    this.ttl = Objects.requireNonNull(ttl);
    this.keep = Objects.requireNonNull(keep);
  }

  @Override
  public FencedLock obtain(Object lockKey) {
    String key = prefix + lockKey;
    FencedLock lock = locks.computeIfAbsent(key, FencedLock::new);
    lock.lastUsed = System.nanoTime();
    return lock;
  }

  @Override
  public void renewLock(Object lockKey) {
    renewLock(lockKey, ttl);
  }

  /**
   * Renews the lease of a lock the current thread holds, for {@code ttl} from now; the keeper
   * renews it for the registry's TTL at its next renewal.
   */
  @Override
  public void renewLock(Object lockKey, Duration ttl) {
    FencedLock lock = locks.get(prefix + lockKey);
    if (lock == null || !lock.local.isHeldByCurrentThread() || lock.kept == null) {
      throw new IllegalMonitorStateException("not held by this thread: " + prefix + lockKey);
    }
    try {
      client.renew(lock.kept.lease(), ttl);
    } catch (LeaseLostException lost) {
      throw new IllegalMonitorStateException("lease lost: " + lost.getMessage());
    } catch (SQLException e) {
      throw new CannotAcquireLockException("pg_fence: could not renew " + lock.key, e);
    }
  }

  /** Forgets the locks no thread holds that were last obtained more than {@code age} ms ago. */
  @Override
  public void expireUnusedOlderThan(long age) {
    long now = System.nanoTime();
    locks
        .values()
        .removeIf(
            lock ->
                !lock.local.isLocked() && now - lock.lastUsed > TimeUnit.MILLISECONDS.toNanos(age));
  }

  /** A lock of the registry: reentrant, its hold a kept pg_fence lease. */
  public final class FencedLock implements DistributedLock {
    private final String key;
    private final ReentrantLock local = new ReentrantLock();
    private volatile KeptLease kept;
    private volatile long lastUsed = System.nanoTime();

    private FencedLock(String key) {
      this.key = key;
    }

    /** The lease key. */
    public String key() {
      return key;
    }

    /** The held lease's fence; empty when this registry does not hold the lock. */
    public OptionalLong fence() {
      KeptLease current = kept;
      return current == null ? OptionalLong.empty() : OptionalLong.of(current.fence());
    }

    /** The kept lease while held: its state, deadline, {@code lost()} future. */
    public Optional<KeptLease> keptLease() {
      return Optional.ofNullable(kept);
    }

    /** Whether the lease is held now (judged by its local deadline too). */
    public boolean isHeld() {
      KeptLease current = kept;
      return current != null && current.isHeld();
    }

    /**
     * Completes with the reason when the held lease is lost; empty when not held. A copy of the
     * kept lease's own.
     */
    public Optional<CompletableFuture<LossReason>> lost() {
      return keptLease().map(KeptLease::lost);
    }

    /**
     * The guard in the caller's transaction on {@code conn}: {@link KeptLease#guard(Connection)} of
     * the held lease. {@link LeaseLostException} when not held.
     */
    public void guard(Connection conn) throws SQLException {
      KeptLease current = kept;
      if (current == null) {
        throw new LeaseLostException(key, null, null);
      }
      current.guard(conn);
    }

    /** {@link PgFence#fencedUpdate} under the held lease's fence, in the caller's transaction. */
    public long fencedUpdate(
        Connection conn,
        String table,
        java.util.Map<String, ?> changes,
        java.util.Map<String, ?> filter)
        throws SQLException {
      KeptLease current = kept;
      if (current == null) {
        throw new LeaseLostException(key, null, null);
      }
      return current.fencedUpdate(conn, table, changes, filter);
    }

    @Override
    public void lock() {
      lock(ttl);
    }

    @Override
    public void lock(Duration ttl) {
      while (true) {
        try {
          if (tryLock(Duration.ofSeconds(60), ttl)) {
            return;
          }
        } catch (InterruptedException interrupted) {
          // lock() is not interruptible: keep the flag for the caller.
          Thread.currentThread().interrupt();
        }
      }
    }

    @Override
    public void lockInterruptibly() throws InterruptedException {
      while (!tryLock(Duration.ofSeconds(60), ttl)) {
        if (Thread.interrupted()) {
          throw new InterruptedException();
        }
      }
    }

    @Override
    public boolean tryLock() {
      try {
        return tryLock(Duration.ZERO, ttl);
      } catch (InterruptedException interrupted) {
        Thread.currentThread().interrupt();
        return false;
      }
    }

    @Override
    public boolean tryLock(long time, TimeUnit unit) throws InterruptedException {
      return tryLock(Duration.ofNanos(unit.toNanos(time)), ttl);
    }

    /**
     * Within {@code waitTime}: the lock in this registry (held by no other thread here), then the
     * key's lease for {@code ttl}, waiting on the server. A reentrant call while the lease is held
     * returns true at once; one that finds the lease lost takes a new lease, or returns false
     * having given up every hold of this thread.
     */
    @Override
    public boolean tryLock(Duration waitTime, Duration ttl) throws InterruptedException {
      long deadline = System.nanoTime() + waitTime.toNanos();
      if (!local.tryLock(waitTime.toNanos(), TimeUnit.NANOSECONDS)) {
        return false;
      }
      lastUsed = System.nanoTime();
      KeptLease current = kept;
      if (current != null) {
        if (current.isHeld()) {
          return true;
        }
        // Lost while held: the earlier holds are void, and this one needs a new lease.
        kept = null;
        current.close();
        while (local.getHoldCount() > 1) {
          local.unlock();
        }
      }
      Duration left = Duration.ofNanos(Math.max(0, deadline - System.nanoTime()));
      try {
        kept = client.hold(key, AcquireOptions.ttl(ttl).waitFor(left), keep);
        return true;
      } catch (WaitTimedOutException notGranted) {
        local.unlock();
        return false;
      } catch (SQLException | RuntimeException e) {
        local.unlock();
        throw new CannotAcquireLockException("pg_fence: could not acquire " + key, e);
      }
    }

    /**
     * Gives up one hold of the current thread; the last releases the lease. {@link
     * ConcurrentModificationException} when the lease had been lost meanwhile (the work done under
     * it may have overlapped another holder's; its guarded writes were refused).
     */
    @Override
    public void unlock() {
      if (!local.isHeldByCurrentThread()) {
        throw new IllegalMonitorStateException("not held by this thread: " + key);
      }
      if (local.getHoldCount() > 1) {
        local.unlock();
        return;
      }
      KeptLease current = kept;
      kept = null;
      try {
        if (current != null) {
          boolean held = current.isHeld();
          Optional<LossReason> reason = current.reason();
          current.close();
          if (!held) {
            throw new ConcurrentModificationException(
                "the lease of "
                    + key
                    + " was lost before unlock ("
                    + reason.map(LossReason::wireName).orElse("unknown")
                    + "): work under it may have overlapped another holder's");
          }
        }
      } finally {
        local.unlock();
      }
    }

    /** Not supported: a condition cannot span processes. */
    @Override
    public Condition newCondition() {
      throw new UnsupportedOperationException("pg_fence locks have no conditions");
    }

    @Override
    public String toString() {
      KeptLease current = kept;
      return "FencedLock[" + key + (current == null ? ", not held]" : ", " + current + "]");
    }
  }
}
