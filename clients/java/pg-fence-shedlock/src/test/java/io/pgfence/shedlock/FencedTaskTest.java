package io.pgfence.shedlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pgfence.FenceClient;
import io.pgfence.StaleFenceException;
import io.pgfence.testing.Cluster;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.time.Duration;
import java.time.Instant;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import net.javacrumbs.shedlock.core.DefaultLockingTaskExecutor;
import net.javacrumbs.shedlock.core.LockConfiguration;
import net.javacrumbs.shedlock.core.LockExtender;
import net.javacrumbs.shedlock.core.LockingTaskExecutor;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The fencing ShedLock #2201 asks for: a task reads its lock's fence while it runs and guards its
 * writes with it; a task that outlives lockAtMostFor while another instance took the lock is
 * refused at its next write.
 */
class FencedTaskTest {
  private static Cluster cluster;
  private static FenceClient client;

  @BeforeAll
  static void create() {
    cluster = new Cluster("shedlock_fenced", 27821).create();
    cluster.sql("CREATE TABLE report (id int PRIMARY KEY, runs int, fence bigint)");
    cluster.sql("INSERT INTO report VALUES (1, 0, 0)");
    client = new FenceClient(cluster.dataSource("shedlock_fenced"));
  }

  @AfterAll
  static void destroy() {
    client.close();
    cluster.destroy();
  }

  private static LockConfiguration config(String name, Duration atMost) {
    return new LockConfiguration(Instant.now(), name, atMost, Duration.ZERO);
  }

  /** One guarded write: the report's run count, stamped with the task's fence. */
  private static void write() throws SQLException {
    PgFenceLock lock = PgFenceLock.current().orElseThrow();
    try (Connection conn = cluster.connect("shedlock_task")) {
      conn.setAutoCommit(false);
      lock.guard(conn);
      try (PreparedStatement statement =
          conn.prepareStatement("UPDATE report SET runs = runs + 1, fence = ? WHERE id = 1")) {
        statement.setLong(1, lock.fence());
        statement.executeUpdate();
      }
      conn.commit();
    }
  }

  @Test
  void aTaskReadsItsFenceAndGuardsItsWrites() throws Throwable {
    String name = "report:" + System.nanoTime();
    PgFenceLockProvider provider = new PgFenceLockProvider(client, "shedlock:");
    LockingTaskExecutor executor = new DefaultLockingTaskExecutor(provider);
    AtomicLong seen = new AtomicLong();
    executor.executeWithLock(
        (LockingTaskExecutor.Task)
            () -> {
              seen.set(PgFenceLock.currentFence().orElseThrow());
              write();
              LockExtender.extendActiveLock(Duration.ofSeconds(30), Duration.ZERO);
              assertEquals(seen.get(), PgFenceLock.currentFence().orElseThrow());
              write();
            },
        config(name, Duration.ofSeconds(10)));
    assertTrue(seen.get() > 0);
    assertFalse(PgFenceLock.current().isPresent(), "no lock outside the task");
    assertEquals(String.valueOf(seen.get()), cluster.sql("SELECT fence FROM report WHERE id = 1"));
    assertEquals(
        "0",
        cluster.sql("SELECT count(*) FROM fence.leases WHERE live AND key = ?", provider.key(name)),
        "unlocked");
  }

  @Test
  void aTaskThatOutlivesLockAtMostForIsRefusedOnceAnotherTookOver() throws Throwable {
    String name = "slow:" + System.nanoTime();
    PgFenceLockProvider provider = new PgFenceLockProvider(client, "shedlock:");
    LockingTaskExecutor slow = new DefaultLockingTaskExecutor(provider);
    LockingTaskExecutor other = new DefaultLockingTaskExecutor(provider);
    AtomicReference<Throwable> refused = new AtomicReference<>();
    AtomicLong otherFence = new AtomicLong();
    slow.executeWithLock(
        (LockingTaskExecutor.Task)
            () -> {
              write();
              Thread.sleep(1500); // past lockAtMostFor: the lock expires meanwhile
              Thread instance =
                  new Thread(
                      () -> {
                        try {
                          other.executeWithLock(
                              (LockingTaskExecutor.Task)
                                  () -> {
                                    otherFence.set(PgFenceLock.currentFence().orElseThrow());
                                    write();
                                  },
                              config(name, Duration.ofSeconds(30)));
                        } catch (Throwable e) {
                          refused.set(e);
                        }
                      });
              instance.start();
              instance.join();
              refused.set(assertThrows(StaleFenceException.class, FencedTaskTest::write));
            },
        config(name, Duration.ofSeconds(1)));
    assertTrue(refused.get() instanceof StaleFenceException, String.valueOf(refused.get()));
    assertTrue(otherFence.get() > 0);
    assertEquals(
        String.valueOf(otherFence.get()), cluster.sql("SELECT fence FROM report WHERE id = 1"));
  }
}
