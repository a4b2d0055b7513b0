package io.pgfence.shedlock;

import io.pgfence.AcquireOptions;
import io.pgfence.FenceClient;
import io.pgfence.KeepOptions;
import io.pgfence.KeptLease;
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
 * lock on the task's thread: its fence to guard its writes with, whether it is still held, and the
 * loss with its reason.
 *
 * <pre>{@code
 * @Bean
 * LockProvider lockProvider(DataSource dataSource) {
 *   return new PgFenceLockProvider(dataSource);
 * }
 * }</pre>
 *
 * <p>By default a lock lasts {@code lockAtMostFor}: a task that runs longer loses it then, and its
 * guarded writes are refused from then on, even when no other instance took the lock. With {@link
 * Builder#keepAlive(boolean)} the client's keeper renews the lease (for {@code lockAtMostFor} each
 * time, every third of it) while the task runs, for any {@code lockAtMostFor}, and stops at unlock:
 *
 * <pre>{@code
 * @Bean
 * LockProvider lockProvider(FenceClient client) {
 *   return PgFenceLockProvider.builder(client).keepAlive(true).build();
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

  /** How kept locks are renewed; null without renewal. */
  private final KeepOptions keep;

  /**
   * A provider on {@code dataSource}, with keys {@code shedlock:<name>}, without renewal.
   *
   * @param dataSource the application's DataSource, with the extension and {@code fence_user}
   */
  public PgFenceLockProvider(DataSource dataSource) {
    this(new FenceClient(dataSource), "shedlock:");
  }

  /**
   * A provider without renewal.
   *
   * @param client the client whose DataSource and retries the locks use
   * @param prefix put before each lock's name to make its key
   */
  public PgFenceLockProvider(FenceClient client, String prefix) {
    this(builder(client).prefix(prefix));
  }

  private PgFenceLockProvider(Builder builder) {
    this.client = builder.client;
    this.prefix = builder.prefix;
    this.owner = builder.owner;
    this.keep = builder.keep;
  }

  /**
   * A builder of a provider on {@code client}: keys {@code shedlock:<name>}, owner {@code shedlock
   * pid <pid>}, no renewal.
   *
   * @param client the client whose DataSource, retries and keeper the locks use
   * @return the builder
   */
  public static Builder builder(FenceClient client) {
    return new Builder(client);
  }

  /** The options of a {@link PgFenceLockProvider}; not thread-safe, {@link #build()} once set. */
  public static final class Builder {
    private final FenceClient client;
    private String prefix = "shedlock:";
    private String owner = "shedlock pid " + ProcessHandle.current().pid();
    private KeepOptions keep;

    private Builder(FenceClient client) {
      this.client = Objects.requireNonNull(client, "client");
    }

    /**
     * Put before each lock's name to make its key; {@code shedlock:} by default.
     *
     * @param prefix the prefix
     * @return this builder
     */
    public Builder prefix(String prefix) {
      this.prefix = Objects.requireNonNull(prefix, "prefix");
      return this;
    }

    /**
     * The owner label of the leases, shown by {@code fence.leases} and {@code pg-fence leases};
     * {@code shedlock pid <pid>} by default.
     *
     * @param owner the label
     * @return this builder
     */
    public Builder owner(String owner) {
      this.owner = Objects.requireNonNull(owner, "owner");
      return this;
    }

    /**
     * Whether the client's keeper renews each lock while its task runs ({@link
     * KeepOptions#defaults()}: for {@code lockAtMostFor} every third of it), for any {@code
     * lockAtMostFor} (ShedLock's {@code KeepAliveLockProvider} takes 30 s at least), so that a
     * healthy task that overruns keeps its lock and its writes; off by default. A kept lock is lost
     * only when a renewal finds it gone (revoked, taken over) or none succeeds before its deadline
     * ({@link io.pgfence.LossReason#UNREACHABLE}): {@link PgFenceLock#lost()} tells it then. A task
     * that hangs holds its lock as long as its process lives: bound the task itself.
     *
     * @param keepAlive true to renew
     * @return this builder
     */
    public Builder keepAlive(boolean keepAlive) {
      this.keep = keepAlive ? (keep == null ? KeepOptions.defaults() : keep) : null;
      return this;
    }

    /**
     * {@link #keepAlive(boolean) keepAlive(true)} with {@code keep}: how often to renew, the
     * backoff, the timeout of the release, a {@link io.pgfence.LeaseListener} told of each loss.
     *
     * @param keep how to keep each lock's lease
     * @return this builder
     */
    public Builder keepAlive(KeepOptions keep) {
      this.keep = Objects.requireNonNull(keep, "keep");
      return this;
    }

    /**
     * The provider.
     *
     * @return a provider with these options
     */
    public PgFenceLockProvider build() {
      return new PgFenceLockProvider(this);
    }
  }

  /**
   * The lease key of a lock.
   *
   * @param name the lock's name
   * @return the provider's prefix and {@code name}
   */
  public String key(String name) {
    return prefix + name;
  }

  /**
   * Acquires the lock's lease for {@code lockAtMostFor}, waiting for nothing.
   *
   * @throws LockException when the server could not be asked (the message says which key)
   */
  @Override
  public Optional<SimpleLock> lock(LockConfiguration config) {
    String key = key(config.getName());
    AcquireOptions opts = AcquireOptions.ttl(config.getLockAtMostFor()).owner(owner);
    try {
      if (keep != null) {
        Optional<KeptLease> kept = client.tryHold(key, opts, keep);
        return kept.map(granted -> PgFenceLock.kept(client, config, granted));
      }
      long sent = System.nanoTime();
      Optional<Lease> lease = client.acquire(key, opts);
      return lease.map(granted -> PgFenceLock.started(client, config, granted, sent));
    } catch (SQLException e) {
      throw new LockException("pg_fence: could not acquire " + key, e);
    }
  }
}
