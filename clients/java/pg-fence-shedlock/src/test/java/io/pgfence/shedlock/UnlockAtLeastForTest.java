package io.pgfence.shedlock;

import static org.junit.jupiter.api.Assertions.assertEquals;

import com.zaxxer.hikari.HikariConfig;
import com.zaxxer.hikari.HikariDataSource;
import io.pgfence.FenceClient;
import io.pgfence.testing.Cluster;
import java.time.Duration;
import java.time.Instant;
import java.time.temporal.ChronoUnit;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.function.Supplier;
import net.javacrumbs.shedlock.core.LockConfiguration;
import net.javacrumbs.shedlock.core.SimpleLock;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * Issue 44: an unlock whose lockAtLeastFor has run out (0, or a few microseconds, with a
 * configuration created at {@code Instant.now()}) releases the lease, so that an immediate re-lock
 * is granted, and never throws. It used to renew the lease for the sub-millisecond left between the
 * configuration's createdAt and ShedLock's millisecond clock (a re-lock refused), or for {@code
 * '0.000000 seconds'}, which the server refuses (unlock threw, the lock held for lockAtMostFor).
 */
class UnlockAtLeastForTest {
  private static final int CYCLES = 1000;
  private static final Duration AT_MOST = Duration.ofSeconds(1);
  private static final int ENOUGH_FAILURES = 20; // then stop: each may wait out lockAtMostFor

  private static Cluster cluster;
  private static HikariDataSource pool;
  private static FenceClient client;

  @BeforeAll
  static void create() {
    cluster = new Cluster("shedlock_unlock", 27822).create();
    // A pool, as a Spring service has: a lock and an unlock take well under a millisecond, so
    // that the unlock comes in the millisecond the configuration was created in.
    HikariConfig config = new HikariConfig();
    config.setJdbcUrl(cluster.url());
    config.setUsername("postgres");
    config.setMaximumPoolSize(2);
    pool = new HikariDataSource(config);
    client = new FenceClient(pool, cluster.dataSource("shedlock_unlock_keeper"), 1);
  }

  @AfterAll
  static void destroy() {
    client.close();
    pool.close();
    cluster.destroy();
  }

  /**
   * Locks and unlocks {@code name} {@code CYCLES} times, each lock right after the previous unlock:
   * the re-locks refused and the unlocks that threw, described; empty when none.
   */
  private static List<String> cycles(
      PgFenceLockProvider provider, String name, Supplier<LockConfiguration> config)
      throws InterruptedException {
    List<String> failures = new ArrayList<>();
    for (int i = 0; i < CYCLES && failures.size() < ENOUGH_FAILURES; i++) {
      LockConfiguration c = config.get();
      Optional<SimpleLock> lock = provider.lock(c);
      if (lock.isEmpty()) {
        failures.add("cycle " + i + ": the re-lock was refused");
        long deadline = System.nanoTime() + AT_MOST.multipliedBy(2).toNanos();
        while (lock.isEmpty() && System.nanoTime() < deadline) {
          Thread.sleep(5);
          lock = provider.lock(config.get());
        }
        if (lock.isEmpty()) {
          failures.add("cycle " + i + ": never granted again");
          return failures;
        }
      }
      try {
        lock.get().unlock();
      } catch (RuntimeException e) {
        failures.add("cycle " + i + ": unlock threw " + e + " caused by " + e.getCause());
      }
    }
    if (failures.isEmpty()) {
      assertEquals(
          "0",
          cluster.sql(
              "SELECT count(*) FROM fence.leases WHERE live AND key = ?", provider.key(name)),
          "the last unlock released");
    }
    return failures;
  }

  private static void assertNone(List<String> failures) {
    assertEquals(
        List.of(),
        failures,
        () ->
            failures.size()
                + " failures (the test stops at "
                + ENOUGH_FAILURES
                + "), the first: "
                + failures.get(0));
  }

  @Test
  void anUnlockWithNoLockAtLeastForReleasesSoThatAnImmediateRelockIsGranted()
      throws InterruptedException {
    String name = "at-least-0:" + System.nanoTime();
    PgFenceLockProvider provider = new PgFenceLockProvider(client, "shedlock:");
    assertNone(
        cycles(
            provider,
            name,
            () -> new LockConfiguration(Instant.now(), name, AT_MOST, Duration.ZERO)));
  }

  @Test
  void anUnlockWithALockAtLeastForOfMicrosecondsReleases() throws InterruptedException {
    String name = "at-least-us:" + System.nanoTime();
    PgFenceLockProvider provider = new PgFenceLockProvider(client, "shedlock:");
    assertNone(
        cycles(
            provider,
            name,
            () -> new LockConfiguration(Instant.now(), name, AT_MOST, Duration.ofNanos(3_000))));
  }

  /**
   * What is left of lockAtLeastFor rounds to 0 at the server's microseconds: released, never a
   * renewal for {@code '0.000000 seconds'}.
   */
  @Test
  void anUnlockWithALockAtLeastForThatRoundsToZeroReleases() throws InterruptedException {
    String name = "at-least-ns:" + System.nanoTime();
    PgFenceLockProvider provider = new PgFenceLockProvider(client, "shedlock:");
    assertNone(
        cycles(
            provider,
            name,
            () ->
                new LockConfiguration(
                    Instant.now().truncatedTo(ChronoUnit.MILLIS),
                    name,
                    AT_MOST,
                    Duration.ofNanos(400))));
  }

  /** The rule itself: release under 2 ms left, else renew for what is left, in microseconds. */
  @Test
  void whatAnUnlockKeeps() {
    Instant now = Instant.parse("2025-01-01T00:00:00Z");
    assertEquals(Duration.ZERO, PgFenceLock.keepFor(now.minusSeconds(1), now));
    assertEquals(Duration.ZERO, PgFenceLock.keepFor(now, now));
    assertEquals(Duration.ZERO, PgFenceLock.keepFor(now.plusNanos(400), now));
    assertEquals(Duration.ZERO, PgFenceLock.keepFor(now.plusNanos(1_999_999), now));
    assertEquals(Duration.ofMillis(2), PgFenceLock.keepFor(now.plusMillis(2), now));
    assertEquals(
        Duration.ofSeconds(60).plusNanos(1_000),
        PgFenceLock.keepFor(now.plusSeconds(60).plusNanos(1_999), now));
  }
}
