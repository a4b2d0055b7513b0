package io.pgfence.spring.support;

import io.pgfence.FenceClient;
import io.pgfence.KeepOptions;
import io.pgfence.LeaseLostException;
import java.sql.SQLException;
import java.time.Duration;
import java.util.Objects;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import org.springframework.dao.CannotAcquireLockException;

/**
 * What the Spring Integration lock registries of each line share: one {@link FencedLockSupport} per
 * key, its renewal and its expiry. The public registries ({@code
 * io.pgfence.spring.PgFenceLockRegistry} for Spring Integration 7, {@code
 * io.pgfence.spring6.PgFenceLockRegistry} for 6) add only the interfaces of their line; an
 * application can ask for this type to get whichever its line has.
 *
 * @param <L> the registry's lock type
 */
public abstract class FencedLockRegistrySupport<L extends FencedLockSupport> {
  private final FenceClient client;
  private final String prefix;
  private final Duration ttl;
  private final KeepOptions keep;
  private final ConcurrentHashMap<String, L> locks = new ConcurrentHashMap<>();
  private volatile String owner;

  /**
   * A registry whose locks are leases of {@code prefix + key}.
   *
   * @param client the client whose DataSource and retries the locks use
   * @param prefix put before each key
   * @param ttl each lock's lease TTL: how long a holder that hangs keeps the key from others
   * @param keep how the leases are kept (renewal period, margin, a listener told of each loss)
   */
  protected FencedLockRegistrySupport(
      FenceClient client, String prefix, Duration ttl, KeepOptions keep) {
    this.client = Objects.requireNonNull(client);
    this.prefix = Objects.requireNonNull(prefix);
    this.ttl = Objects.requireNonNull(ttl);
    this.keep = Objects.requireNonNull(keep);
  }

  /**
   * Makes the lock of one key, the first time it is obtained.
   *
   * @param client the registry's client
   * @param key the lease key, prefix included
   * @param ttl the registry's TTL
   * @param keep the registry's keep options
   * @return a new lock, not held
   */
  protected abstract L newLock(FenceClient client, String key, Duration ttl, KeepOptions keep);

  /**
   * Names the owner of the leases of the locks obtained from now on ({@code lease_acquire}'s {@code
   * owner}, shown by {@code fence.leases} and {@code pg-fence leases}); none by default.
   *
   * @param owner who holds the leases, e.g. a host and process; null for none
   */
  public void setOwner(String owner) {
    this.owner = owner;
  }

  /**
   * The lease key prefix.
   *
   * @return what is put before each key
   */
  public String prefix() {
    return prefix;
  }

  /**
   * The TTL each lock's lease is taken for, unless a call gives its own.
   *
   * @return the registry's TTL
   */
  public Duration ttl() {
    return ttl;
  }

  /**
   * The lock of {@code lockKey} in this registry: the same object for the same key while it is
   * used.
   *
   * @param lockKey the key, to which the prefix is added
   * @return the key's lock
   */
  public L obtain(Object lockKey) {
    L lock =
        locks.computeIfAbsent(
            prefix + lockKey,
            key -> {
              L made = newLock(client, key, ttl, keep);
              made.owner(owner);
              return made;
            });
    lock.touch();
    return lock;
  }

  /**
   * Renews the lease of a lock the current thread holds, for the registry's TTL from now.
   *
   * @param lockKey the key, to which the prefix is added
   * @throws IllegalMonitorStateException when the current thread does not hold it, or its lease was
   *     lost
   */
  public void renewLock(Object lockKey) {
    renewLock(lockKey, ttl);
  }

  /**
   * Renews the lease of a lock the current thread holds, for {@code ttl} from now; the keeper
   * renews it for the registry's TTL at its next renewal.
   *
   * @param lockKey the key, to which the prefix is added
   * @param ttl how long from now
   * @throws IllegalMonitorStateException when the current thread does not hold it, or its lease was
   *     lost
   */
  public void renewLock(Object lockKey, Duration ttl) {
    L lock = locks.get(prefix + lockKey);
    if (lock == null || !lock.isHeldByCurrentThread() || lock.kept() == null) {
      throw new IllegalMonitorStateException("not held by this thread: " + prefix + lockKey);
    }
    try {
      client.renew(lock.kept().lease(), ttl);
    } catch (LeaseLostException lost) {
      throw new IllegalMonitorStateException("lease lost: " + lost.getMessage());
    } catch (SQLException e) {
      throw new CannotAcquireLockException("pg_fence: could not renew " + lock.key(), e);
    }
  }

  /**
   * Forgets the locks no thread holds that were last obtained more than {@code age} ms ago.
   *
   * @param age in milliseconds
   */
  public void expireUnusedOlderThan(long age) {
    locks.values().removeIf(lock -> lock.unusedFor(TimeUnit.MILLISECONDS.toNanos(age)));
  }
}
