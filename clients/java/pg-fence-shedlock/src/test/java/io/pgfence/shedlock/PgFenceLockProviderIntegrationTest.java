package io.pgfence.shedlock;

import static org.junit.jupiter.api.Assertions.assertEquals;

import io.pgfence.FenceClient;
import io.pgfence.testing.Cluster;
import net.javacrumbs.shedlock.core.ExtensibleLockProvider;
import net.javacrumbs.shedlock.test.support.AbstractExtensibleLockProviderIntegrationTest;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;

/**
 * ShedLock's own integration tests for extensible lock providers (shedlock-test-support), run
 * against pg_fence: locking, a second lock refused, lockAtMostFor as the TTL, lockAtLeastFor,
 * extending, the fuzz test.
 */
class PgFenceLockProviderIntegrationTest extends AbstractExtensibleLockProviderIntegrationTest {
  private static Cluster cluster;
  private static FenceClient client;

  // Each test has a prefix of its own: the suite uses one lock name throughout.
  private final String prefix = "shedlock:" + System.nanoTime() + ":";
  private final PgFenceLockProvider provider = new PgFenceLockProvider(client, prefix);

  @BeforeAll
  static void create() {
    cluster = new Cluster("shedlock", 27820).create();
    client = new FenceClient(cluster.dataSource("shedlock"));
  }

  @AfterAll
  static void destroy() {
    client.close();
    cluster.destroy();
  }

  @Override
  protected ExtensibleLockProvider getLockProvider() {
    return provider;
  }

  private String live(String name) {
    return cluster.sql(
        "SELECT count(*) FROM fence.leases WHERE key = ? AND live", provider.key(name));
  }

  @Override
  protected void assertUnlocked(String lockName) {
    assertEquals("0", live(lockName), lockName + " is locked");
  }

  @Override
  protected void assertLocked(String lockName) {
    assertEquals("1", live(lockName), lockName + " is not locked");
  }
}
