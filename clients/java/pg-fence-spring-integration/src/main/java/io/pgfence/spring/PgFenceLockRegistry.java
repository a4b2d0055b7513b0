package io.pgfence.spring;

import io.pgfence.FenceClient;
import io.pgfence.KeepOptions;
import io.pgfence.spring.support.FencedLockRegistrySupport;
import io.pgfence.spring.support.FencedLockSupport;
import java.time.Duration;
import javax.sql.DataSource;
import org.springframework.integration.support.locks.DistributedLock;
import org.springframework.integration.support.locks.ExpirableLockRegistry;
import org.springframework.integration.support.locks.RenewableLockRegistry;

/**
 * A Spring Integration 7 {@link RenewableLockRegistry} on pg_fence leases (for Spring Boot 4; on
 * Spring Integration 6, Boot 3, take {@code io.pgfence.spring6.PgFenceLockRegistry} of module
 * pg-fence-spring-integration-6). {@link #obtain(Object)} gives one {@link FencedLock} per key in
 * this registry: a {@link java.util.concurrent.locks.Lock} (reentrant, held by one thread here, and
 * by one registry among all that share the database) whose hold is a kept lease of the key {@code
 * prefix + key}, renewed in the background every ttl/3 and told lost the moment it is. Its holder
 * can read the lease's fence ({@link FencedLock#fence()}) and guard its writes with it ({@link
 * FencedLock#guard(java.sql.Connection)}), which no other JDBC lock registry offers: a holder that
 * hung past its TTL while another took over is refused at its next guarded write.
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
 * <p>The locks' behaviour is {@link FencedLockSupport}'s; {@code renewLock} renews at once (the
 * keeper renews anyway).
 */
public final class PgFenceLockRegistry
    extends FencedLockRegistrySupport<PgFenceLockRegistry.FencedLock>
    implements RenewableLockRegistry<PgFenceLockRegistry.FencedLock>,
        ExpirableLockRegistry<PgFenceLockRegistry.FencedLock> {

  /**
   * A registry on {@code dataSource}: keys {@code spring:<key>}, a TTL of 30 s.
   *
   * @param dataSource where the connections come from
   */
  public PgFenceLockRegistry(DataSource dataSource) {
    this(new FenceClient(dataSource), "spring:", Duration.ofSeconds(30), KeepOptions.defaults());
  }

  /**
   * A registry with its own prefix, TTL and keep options.
   *
   * @param client the client whose DataSource and retries the locks use
   * @param prefix put before each key
   * @param ttl each lock's lease TTL: how long a holder that hangs keeps the key from others
   * @param keep how the leases are kept (renewal period, margin, a listener told of each loss)
   */
  public PgFenceLockRegistry(FenceClient client, String prefix, Duration ttl, KeepOptions keep) {
    super(client, prefix, ttl, keep);
  }

  @Override
  protected FencedLock newLock(FenceClient client, String key, Duration ttl, KeepOptions keep) {
    return new FencedLock(client, key, ttl, keep);
  }

  /**
   * A lock of the registry: reentrant, its hold a kept pg_fence lease (see {@link
   * FencedLockSupport}).
   */
  public static final class FencedLock extends FencedLockSupport implements DistributedLock {
    private FencedLock(FenceClient client, String key, Duration ttl, KeepOptions keep) {
      super(client, key, ttl, keep);
    }
  }
}
