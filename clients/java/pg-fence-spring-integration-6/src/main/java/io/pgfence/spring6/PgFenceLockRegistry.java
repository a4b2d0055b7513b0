package io.pgfence.spring6;

import io.pgfence.FenceClient;
import io.pgfence.KeepOptions;
import io.pgfence.spring.support.FencedLockRegistrySupport;
import io.pgfence.spring.support.FencedLockSupport;
import java.time.Duration;
import javax.sql.DataSource;
import org.springframework.integration.support.locks.ExpirableLockRegistry;
import org.springframework.integration.support.locks.RenewableLockRegistry;

/**
 * A Spring Integration 6 {@link RenewableLockRegistry} on pg_fence leases, for Spring Boot 3 (on
 * Spring Integration 7, Boot 4, take {@code io.pgfence.spring.PgFenceLockRegistry} of module
 * pg-fence-spring-integration). The locks are those of the Spring Integration 7 registry, less the
 * {@code DistributedLock} interface that line added: reentrant, each held by one thread here and by
 * one registry among all that share the database, its hold a kept lease of the key {@code prefix +
 * key}, with its fence ({@link FencedLock#fence()}) and guard ({@link
 * FencedLock#guard(java.sql.Connection)}); see {@link FencedLockSupport}.
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
 */
public final class PgFenceLockRegistry
    extends FencedLockRegistrySupport<PgFenceLockRegistry.FencedLock>
    implements RenewableLockRegistry, ExpirableLockRegistry {

  /**
   * A lock of the registry: reentrant, its hold a kept pg_fence lease (see {@link
   * FencedLockSupport}). Spring Integration 6 has no {@code DistributedLock}: {@link
   * FencedLockSupport#tryLock(Duration, Duration)} and {@link FencedLockSupport#lock(Duration)} are
   * there all the same.
   */
  public static final class FencedLock extends FencedLockSupport {
    private FencedLock(FenceClient client, String key, Duration ttl, KeepOptions keep) {
      super(client, key, ttl, keep);
    }
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

  /**
   * A registry on {@code dataSource}: keys {@code spring:<key>}, a TTL of 30 s.
   *
   * @param dataSource where the connections come from
   */
  public PgFenceLockRegistry(DataSource dataSource) {
    this(new FenceClient(dataSource), "spring:", Duration.ofSeconds(30), KeepOptions.defaults());
  }

  @Override
  protected FencedLock newLock(FenceClient client, String key, Duration ttl, KeepOptions keep) {
    return new FencedLock(client, key, ttl, keep);
  }
}
