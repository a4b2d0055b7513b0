package io.pgfence.spring;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pgfence.FenceClient;
import io.pgfence.KeepOptions;
import io.pgfence.LossReason;
import io.pgfence.StaleFenceException;
import io.pgfence.testing.Cluster;
import java.sql.Connection;
import java.time.Duration;
import java.util.ConcurrentModificationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInfo;

/** The registry's locks against a real server, two registries standing for two processes. */
class PgFenceLockRegistryTest {
  private static Cluster cluster;
  private static FenceClient one;
  private static FenceClient two;

  @BeforeAll
  static void create() {
    cluster = new Cluster("spring", 27830).create();
    one = new FenceClient(cluster.dataSource("spring_one"));
    two = new FenceClient(cluster.dataSource("spring_two"));
  }

  @AfterAll
  static void destroy() {
    one.close();
    two.close();
    cluster.destroy();
  }

  private static PgFenceLockRegistry registry(FenceClient client, Duration ttl) {
    return new PgFenceLockRegistry(client, "spring:", ttl, KeepOptions.defaults());
  }

  private static String key(TestInfo info) {
    return info.getDisplayName() + System.nanoTime();
  }

  @Test
  void oneHolderAmongRegistriesReentrantAndFenced(TestInfo info) throws Exception {
    String key = key(info);
    PgFenceLockRegistry first = registry(one, Duration.ofSeconds(30));
    PgFenceLockRegistry second = registry(two, Duration.ofSeconds(30));
    PgFenceLockRegistry.FencedLock lock = first.obtain(key);
    assertSame(lock, first.obtain(key));
    assertTrue(lock.tryLock());
    long fence = lock.fence().orElseThrow();
    assertTrue(lock.tryLock(), "reentrant");
    PgFenceLockRegistry.FencedLock other = second.obtain(key);
    assertFalse(other.tryLock(200, TimeUnit.MILLISECONDS), "held by the first registry");
    CompletableFuture<Boolean> waiting =
        CompletableFuture.supplyAsync(
            () -> {
              try {
                boolean got = other.tryLock(10, TimeUnit.SECONDS);
                if (got) {
                  other.unlock();
                }
                return got;
              } catch (InterruptedException e) {
                throw new IllegalStateException(e);
              }
            });
    lock.unlock();
    assertTrue(lock.isHeld(), "one hold left");
    Thread.sleep(300);
    assertFalse(waiting.isDone());
    lock.unlock();
    assertTrue(waiting.get(10, TimeUnit.SECONDS), "granted at the release, waiting on the server");
    assertFalse(lock.fence().isPresent());
    assertThrows(IllegalMonitorStateException.class, lock::unlock);
    assertTrue(fence > 0);
  }

  @Test
  void renewedInTheBackgroundPastItsTtl(TestInfo info) throws Exception {
    String key = key(info);
    PgFenceLockRegistry.FencedLock lock = registry(one, Duration.ofMillis(1500)).obtain(key);
    assertTrue(lock.tryLock());
    Thread.sleep(4000);
    assertTrue(lock.isHeld());
    assertFalse(registry(two, Duration.ofSeconds(30)).obtain(key).tryLock());
    try (Connection conn = cluster.connect("spring_writer")) {
      conn.setAutoCommit(false);
      lock.guard(conn);
      conn.commit();
    }
    assertThrows(
        IllegalMonitorStateException.class,
        () -> registry(one, Duration.ofMillis(1500)).renewLock(key),
        "another registry does not hold it");
    lock.unlock();
  }

  @Test
  void aLostLockIsToldRefusedAndItsUnlockSaysSo(TestInfo info) throws Exception {
    String key = key(info);
    PgFenceLockRegistry registry = registry(one, Duration.ofSeconds(3));
    PgFenceLockRegistry.FencedLock lock = registry.obtain(key);
    assertTrue(lock.tryLock());
    registry.renewLock(key);
    CompletableFuture<LossReason> lost = lock.lost().orElseThrow();
    cluster.revoke("spring:" + key);
    assertEquals(LossReason.REVOKED, lost.get(5, TimeUnit.SECONDS));
    assertFalse(lock.isHeld());
    ConcurrentModificationException unlocked =
        assertThrows(ConcurrentModificationException.class, lock::unlock);
    assertTrue(unlocked.getMessage().contains("revoked"), unlocked.getMessage());
    // A long TTL, so that no renewal tells the keeper before the guard does.
    PgFenceLockRegistry.FencedLock again = registry(one, Duration.ofSeconds(60)).obtain(key);
    assertTrue(again.tryLock(), "free again: a new lease");
    cluster.revoke("spring:" + key);
    try (Connection conn = cluster.connect("spring_writer")) {
      conn.setAutoCommit(false);
      assertThrows(StaleFenceException.class, () -> again.guard(conn), "refused by the server");
      conn.rollback();
    }
    assertFalse(again.isHeld(), "the stale guard told the lock");
    assertThrows(ConcurrentModificationException.class, again::unlock);
  }

  @Test
  void executeLocked(TestInfo info) throws Exception {
    String key = key(info);
    PgFenceLockRegistry registry = registry(one, Duration.ofSeconds(30));
    String answer =
        registry.executeLocked(
            key, () -> registry.obtain(key).fence().isPresent() ? "fenced" : "not held");
    assertEquals("fenced", answer);
    assertFalse(registry.obtain(key).isHeld());
  }
}
