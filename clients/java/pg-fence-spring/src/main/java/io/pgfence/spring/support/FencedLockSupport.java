package io.pgfence.spring.support;

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
import java.util.Map;
import java.util.Objects;
import java.util.Optional;
import java.util.OptionalLong;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.Lock;
import java.util.concurrent.locks.ReentrantLock;
import org.springframework.dao.CannotAcquireLockException;

/**
 * A lock of a {@link FencedLockRegistrySupport}: reentrant, held by one thread in its registry, its
 * hold a kept pg_fence lease of its key, renewed in the background and told lost the moment it is.
 * Its holder reads the lease's fence ({@link #fence()}) and guards its writes with it ({@link
 * #guard(Connection)}).
 *
 * <p>{@code tryLock(time, unit)} waits on the server ({@code lease_acquire} with {@code wait}),
 * woken by the holder's release, not by polling. {@code unlock()} releases the lease; when the
 * lease was lost meanwhile it throws {@link ConcurrentModificationException} with the reason, as
 * Spring's {@code JdbcLockRegistry} does for an expired lock.
 */
public abstract class FencedLockSupport implements Lock {
  private final FenceClient client;
  private final String key;
  private final Duration ttl;
  private final KeepOptions keep;
  private final ReentrantLock local = new ReentrantLock();
  private volatile KeptLease kept;
  private volatile long lastUsed = System.nanoTime();
  private volatile String owner;

  /**
   * A lock, not held.
   *
   * @param client the client that takes and keeps the lease
   * @param key the lease key
   * @param ttl the lease TTL of {@link #lock()} and the {@code tryLock} calls without one
   * @param keep how the lease is kept
   */
  protected FencedLockSupport(FenceClient client, String key, Duration ttl, KeepOptions keep) {
    this.client = Objects.requireNonNull(client);
    this.key = Objects.requireNonNull(key);
    this.ttl = Objects.requireNonNull(ttl);
    this.keep = Objects.requireNonNull(keep);
  }

  /**
   * The lease key.
   *
   * @return the key, prefix included
   */
  public String key() {
    return key;
  }

  /**
   * The held lease's fence.
   *
   * @return the fence; empty when this registry does not hold the lock
   */
  public OptionalLong fence() {
    KeptLease current = kept;
    return current == null ? OptionalLong.empty() : OptionalLong.of(current.fence());
  }

  /**
   * The kept lease while held: its state, deadline, {@code lost()} future.
   *
   * @return the kept lease; empty when not held
   */
  public Optional<KeptLease> keptLease() {
    return Optional.ofNullable(kept);
  }

  /**
   * Whether the lease is held now (judged by its local deadline too).
   *
   * @return true while held
   */
  public boolean isHeld() {
    KeptLease current = kept;
    return current != null && current.isHeld();
  }

  /**
   * A copy of the kept lease's own future of its loss.
   *
   * @return completes with the reason when the held lease is lost; empty when not held
   */
  public Optional<CompletableFuture<LossReason>> lost() {
    return keptLease().map(KeptLease::lost);
  }

  /**
   * The guard in the caller's transaction on {@code conn}: {@link KeptLease#guard(Connection)} of
   * the held lease.
   *
   * @param conn a connection in the transaction of the writes (not autocommit)
   * @throws LeaseLostException when not held
   * @throws io.pgfence.StaleFenceException when another holder took the key
   * @throws SQLException when the server could not be asked
   */
  public void guard(Connection conn) throws SQLException {
    KeptLease current = kept;
    if (current == null) {
      throw new LeaseLostException(key, null, null);
    }
    current.guard(conn);
  }

  /**
   * {@link PgFence#fencedUpdate} under the held lease's fence, in the caller's transaction.
   *
   * @param conn the connection of the write
   * @param table the table to update
   * @param changes column names to new values
   * @param filter column names to the values that pick the rows
   * @return the number of rows updated
   * @throws LeaseLostException when not held
   * @throws io.pgfence.StaleFenceException when another holder took the key
   * @throws SQLException when the update failed
   */
  public long fencedUpdate(
      Connection conn, String table, Map<String, ?> changes, Map<String, ?> filter)
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

  /**
   * Waits for the lock, uninterruptibly, and takes its lease for {@code ttl}.
   *
   * @param ttl the lease's TTL
   */
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
   * returns true at once; one that finds the lease lost takes a new lease, or returns false having
   * given up every hold of this thread.
   *
   * @param waitTime how long to wait for the lock
   * @param ttl the lease's TTL
   * @return whether the lock is held
   * @throws InterruptedException when interrupted while waiting
   * @throws CannotAcquireLockException when the server could not be asked
   */
  public boolean tryLock(Duration waitTime, Duration ttl) throws InterruptedException {
    long deadline = System.nanoTime() + waitTime.toNanos();
    if (!local.tryLock(waitTime.toNanos(), TimeUnit.NANOSECONDS)) {
      return false;
    }
    touch();
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
      AcquireOptions opts = AcquireOptions.ttl(ttl).waitFor(left);
      String named = owner;
      kept = client.hold(key, named == null ? opts : opts.owner(named), keep);
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
   * ConcurrentModificationException} when the lease had been lost meanwhile (the work done under it
   * may have overlapped another holder's; its guarded writes were refused).
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
    return getClass().getSimpleName()
        + "["
        + key
        + (current == null ? ", not held]" : ", " + current + "]");
  }

  void owner(String owner) {
    this.owner = owner;
  }

  void touch() {
    lastUsed = System.nanoTime();
  }

  boolean unusedFor(long nanos) {
    return !local.isLocked() && System.nanoTime() - lastUsed > nanos;
  }

  boolean isHeldByCurrentThread() {
    return local.isHeldByCurrentThread();
  }

  KeptLease kept() {
    return kept;
  }
}
