package io.pgfence.shedlock;

import io.pgfence.AcquireOptions;
import io.pgfence.FenceClient;
import io.pgfence.Lease;
import java.sql.SQLException;
import java.util.Objects;
import java.util.Optional;
import javax.sql.DataSource;
import net.javacrumbs.shedlock.core.ExtensibleLockProvider;
import net.javacrumbs.shedlock.core.LockConfiguration;
import net.javacrumbs.shedlock.core.SimpleLock;
import net.javacrumbs.shedlock.support.LockException;

/**
 * A ShedLock {@link ExtensibleLockProvider} on pg_fence leases: a task's lock is a lease of the key
 * {@code prefix + name}, granted for {@code lockAtMostFor} with a fence. {@code lockAtLeastFor} is
 * kept as ShedLock defines it (an unlock before then leaves the lease to run until then), and
 * {@code extend} renews the lease. While the task runs, {@link PgFenceLock#current()} gives its
 * lease and fence on the task's thread, to guard its writes: a task that outlives {@code
 * lockAtMostFor} while another instance took over is refused at its next guarded write.
 *
 * <pre>{@code
 * @Bean
 * LockProvider lockProvider(DataSource dataSource) {
 *   return new PgFenceLockProvider(dataSource);
 * }
 * }</pre>
 *
 * <p>No table to create: {@code CREATE EXTENSION pg_fence} and {@code GRANT fence_user} are all.
 * The calls are retried with backoff when the connection breaks; an acquire carries one token on
 * every try, so a lost reply does not leave the task's lock held by nobody until {@code
 * lockAtMostFor}.
 */
public final class PgFenceLockProvider implements ExtensibleLockProvider {
  private final FenceClient client;
  private final String prefix;
  private final String owner;

  /** A provider on {@code dataSource}, with keys {@code shedlock:<name>}. */
  public PgFenceLockProvider(DataSource dataSource) {
    this(new FenceClient(dataSource), "shedlock:");
  }

  /**
   * @param client the client whose DataSource and retries the locks use
   * @param prefix put before each lock's name to make its key
   */
  public PgFenceLockProvider(FenceClient client, String prefix) {
    this.client = Objects.requireNonNull(client);
    this.prefix = Objects.requireNonNull(prefix);
    this.owner = "shedlock pid " + ProcessHandle.current().pid();
  }

  /** The lease key of the lock {@code name}. */
  public String key(String name) {
    return prefix + name;
  }

  @Override
  public Optional<SimpleLock> lock(LockConfiguration config) {
    AcquireOptions opts = AcquireOptions.ttl(config.getLockAtMostFor()).owner(owner);
    try {
      Optional<Lease> lease = client.acquire(key(config.getName()), opts);
      return lease.map(granted -> PgFenceLock.started(client, config, granted));
    } catch (SQLException e) {
      throw new LockException("pg_fence: could not acquire " + key(config.getName()), e);
    }
  }
}
