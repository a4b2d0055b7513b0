package io.pgfence.shedlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pgfence.FenceClient;
import io.pgfence.KeptLease;
import io.pgfence.LeaseLostException;
import io.pgfence.LossReason;
import io.pgfence.StaleFenceException;
import io.pgfence.testing.Cluster;
import io.pgfence.testing.Proxy;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.time.Duration;
import java.time.Instant;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.BooleanSupplier;
import net.javacrumbs.shedlock.core.DefaultLockingTaskExecutor;
import net.javacrumbs.shedlock.core.LockConfiguration;
import net.javacrumbs.shedlock.core.LockingTaskExecutor;
import net.javacrumbs.shedlock.core.SimpleLock;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * What a running task learns of its lock ({@link PgFenceLock#isHeld()}, {@link
 * PgFenceLock#reason()}, {@link PgFenceLock#lost()}), and the provider's own renewal ({@code
 * keepAlive}): a short-TTL task that overruns {@code lockAtMostFor} keeps its lock and its writes
 * with it, and loses both without it.
 */
class LockSignalsTest {
  /** Generous: the machine may be loaded; only a hang takes this long. */
  private static final long BOUND_SECONDS = 60;

  private static Cluster cluster;
  private static FenceClient client;

  @BeforeAll
  static void create() {
    cluster = new Cluster("shedlock_signals", 27823).create();
    cluster.sql("CREATE TABLE runs (name text PRIMARY KEY, writes int, fence bigint)");
    client = new FenceClient(cluster.dataSource("shedlock_signals"));
  }

  @AfterAll
  static void destroy() {
    client.close();
    cluster.destroy();
  }

  private static LockConfiguration config(String name, Duration atMost, Duration atLeast) {
    return new LockConfiguration(Instant.now(), name, atMost, atLeast);
  }

  private static PgFenceLockProvider keptProvider() {
    return PgFenceLockProvider.builder(client).keepAlive(true).build();
  }

  /** One write guarded by the task's lock: the run's count, stamped with its fence. */
  private static void write(String name) throws SQLException {
    PgFenceLock lock = PgFenceLock.current().orElseThrow();
    try (Connection conn = cluster.connect("shedlock_signals_task")) {
      conn.setAutoCommit(false);
      lock.guard(conn);
      try (PreparedStatement statement =
          conn.prepareStatement(
              "INSERT INTO runs VALUES (?, 1, ?) ON CONFLICT (name)"
                  + " DO UPDATE SET writes = runs.writes + 1, fence = excluded.fence")) {
        statement.setString(1, name);
        statement.setLong(2, lock.fence());
        statement.executeUpdate();
      }
      conn.commit();
    }
  }

  private static String live(PgFenceLockProvider provider, String name) {
    return cluster.sql(
        "SELECT count(*) FROM fence.leases WHERE live AND key = ?", provider.key(name));
  }

  private static void await(String what, BooleanSupplier condition) throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(BOUND_SECONDS);
    while (!condition.getAsBoolean()) {
      if (System.nanoTime() - deadline > 0) {
        throw new AssertionError("not within " + BOUND_SECONDS + " s: " + what);
      }
      Thread.sleep(20);
    }
  }

  private static LossReason lossOf(PgFenceLock lock) throws Exception {
    return lock.lost().get(BOUND_SECONDS, TimeUnit.SECONDS);
  }

  @Test
  void aKeptLockIsToldItWasRevokedWithTheReason() throws Throwable {
    String name = "revoked:" + System.nanoTime();
    PgFenceLockProvider provider = keptProvider();
    AtomicReference<PgFenceLock> seen = new AtomicReference<>();
    new DefaultLockingTaskExecutor(provider)
        .executeWithLock(
            (LockingTaskExecutor.Task)
                () -> {
                  PgFenceLock lock = PgFenceLock.current().orElseThrow();
                  seen.set(lock);
                  assertTrue(lock.isHeld());
                  assertEquals(Optional.empty(), lock.reason());
                  CompletableFuture<LossReason> lost = lock.lost();
                  write(name);
                  assertEquals(
                      "t",
                      cluster.sql("SELECT fence.lease_revoke(?)", provider.key(name)),
                      "revoked");
                  assertEquals(LossReason.REVOKED, lost.get(BOUND_SECONDS, TimeUnit.SECONDS));
                  assertFalse(lock.isHeld());
                  assertEquals(Optional.of(LossReason.REVOKED), lock.reason());
                  LeaseLostException refused =
                      assertThrows(LeaseLostException.class, () -> write(name));
                  assertEquals(Optional.of(LossReason.REVOKED), refused.reason());
                  assertEquals(
                      LossReason.REVOKED,
                      assertThrows(LeaseLostException.class, lock::check).reason().orElseThrow());
                },
            config(name, Duration.ofSeconds(3), Duration.ZERO));
    assertEquals(
        KeptLease.State.LOST, seen.get().keptLease().orElseThrow().state(), "not released");
    assertEquals("1", cluster.sql("SELECT writes FROM runs WHERE name = ?", name));
  }

  /**
   * The keeper's replies lost (its connections go through a proxy that drops every renewal's
   * reply): the task is told {@code unreachable} at the local deadline, before the server's expiry,
   * and its guarded writes are refused from then on without asking the server.
   */
  @Test
  void aKeptLockWhoseRenewalsGetNoAnswerIsToldUnreachable() throws Throwable {
    String name = "unreachable:" + System.nanoTime();
    try (Proxy proxy = new Proxy(cluster.port());
        FenceClient cutOff =
            new FenceClient(
                cluster.dataSource("shedlock_signals"),
                Cluster.dataSource("shedlock_signals_keeper", proxy.port()),
                1)) {
      PgFenceLockProvider provider = PgFenceLockProvider.builder(cutOff).keepAlive(true).build();
      new DefaultLockingTaskExecutor(provider)
          .executeWithLock(
              (LockingTaskExecutor.Task)
                  () -> {
                    PgFenceLock lock = PgFenceLock.current().orElseThrow();
                    write(name);
                    proxy.dropEveryReply(true);
                    proxy.dropReplyAfter("lease_renew_many");
                    assertEquals(LossReason.UNREACHABLE, lossOf(lock));
                    assertFalse(lock.isHeld());
                    assertEquals(Optional.of(LossReason.UNREACHABLE), lock.reason());
                    assertThrows(LeaseLostException.class, () -> write(name));
                  },
              config(name, Duration.ofSeconds(3), Duration.ZERO));
      assertTrue(proxy.dropped() > 0, "no renewal's reply was lost");
    }
    assertEquals("1", cluster.sql("SELECT writes FROM runs WHERE name = ?", name));
  }

  /**
   * lockAtMostFor 2 s, a task of 5 s that writes every half second: with renewal, every write is
   * granted and the lock is never lost; at unlock the renewal stops and the lease is released.
   */
  @Test
  void aShortTtlTaskThatOverrunsKeepsItsLockAndWritesWithRenewal() throws Throwable {
    String name = "kept:" + System.nanoTime();
    PgFenceLockProvider provider = keptProvider();
    AtomicReference<PgFenceLock> seen = new AtomicReference<>();
    AtomicInteger writes = new AtomicInteger();
    new DefaultLockingTaskExecutor(provider)
        .executeWithLock(
            (LockingTaskExecutor.Task)
                () -> {
                  PgFenceLock lock = PgFenceLock.current().orElseThrow();
                  seen.set(lock);
                  long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
                  while (System.nanoTime() - end < 0) {
                    lock.check();
                    write(name);
                    writes.incrementAndGet();
                    Thread.sleep(500);
                  }
                  assertTrue(lock.isHeld(), "held after 5 s of a 2 s lockAtMostFor");
                  assertFalse(lock.lost().isDone());
                },
            config(name, Duration.ofSeconds(2), Duration.ZERO));
    PgFenceLock lock = seen.get();
    assertEquals(
        String.valueOf(writes.get()), cluster.sql("SELECT writes FROM runs WHERE name = ?", name));
    assertTrue(writes.get() >= 2, "wrote " + writes.get() + " times");
    assertEquals(
        String.valueOf(lock.fence()), cluster.sql("SELECT fence FROM runs WHERE name = ?", name));
    assertEquals("0", live(provider, name), "released at unlock");
    assertEquals(KeptLease.State.RELEASED, lock.keptLease().orElseThrow().state());
    assertFalse(lock.isHeld());
    assertTrue(lock.lost().isCancelled(), "unlocked first: the loss future is cancelled");
    Optional<SimpleLock> again = provider.lock(config(name, Duration.ofSeconds(2), Duration.ZERO));
    assertTrue(again.isPresent(), "granted again at once");
    again.get().unlock();
  }

  /**
   * The same task without renewal (the default): the lock is lost ({@code expired}) when
   * lockAtMostFor runs out, and its guarded writes are refused from the server's expiry on, though
   * nobody took the lock.
   */
  @Test
  void withoutRenewalAnOverrunningTaskLosesItsLockAndItsWritesAreRefused() throws Throwable {
    String name = "unkept:" + System.nanoTime();
    PgFenceLockProvider provider = new PgFenceLockProvider(client, "shedlock:");
    AtomicReference<StaleFenceException> refused = new AtomicReference<>();
    new DefaultLockingTaskExecutor(provider)
        .executeWithLock(
            (LockingTaskExecutor.Task)
                () -> {
                  PgFenceLock lock = PgFenceLock.current().orElseThrow();
                  assertEquals(Optional.empty(), lock.keptLease());
                  write(name);
                  assertTrue(lock.isHeld());
                  assertEquals(LossReason.EXPIRED, lossOf(lock));
                  assertFalse(lock.isHeld());
                  assertEquals(Optional.of(LossReason.EXPIRED), lock.reason());
                  await("the server's expiry", () -> live(provider, name).equals("0"));
                  refused.set(assertThrows(StaleFenceException.class, () -> write(name)));
                  assertEquals(Optional.of(LossReason.EXPIRED), lock.reason());
                },
            config(name, Duration.ofSeconds(2), Duration.ZERO));
    assertEquals(provider.key(name), refused.get().key());
    assertEquals("1", cluster.sql("SELECT writes FROM runs WHERE name = ?", name));
  }

  /** Without renewal a revoke is learnt at the task's next guarded write, with its reason. */
  @Test
  void withoutRenewalARevokeIsLearntAtTheNextGuardedWrite() throws Throwable {
    String name = "unkept-revoked:" + System.nanoTime();
    PgFenceLockProvider provider = new PgFenceLockProvider(client, "shedlock:");
    new DefaultLockingTaskExecutor(provider)
        .executeWithLock(
            (LockingTaskExecutor.Task)
                () -> {
                  PgFenceLock lock = PgFenceLock.current().orElseThrow();
                  CompletableFuture<LossReason> lost = lock.lost();
                  cluster.sql("SELECT fence.lease_revoke(?)", provider.key(name));
                  assertThrows(StaleFenceException.class, () -> write(name));
                  assertEquals(LossReason.REVOKED, lost.get(BOUND_SECONDS, TimeUnit.SECONDS));
                  assertFalse(lock.isHeld());
                  assertEquals(Optional.of(LossReason.REVOKED), lock.reason());
                },
            config(name, Duration.ofSeconds(30), Duration.ZERO));
  }

  /**
   * With renewal, an unlock inside lockAtLeastFor stops renewing and leaves the lease to run out at
   * lockAtLeastFor: held meanwhile, free after it.
   */
  @Test
  void aKeptLockUnlockedInsideLockAtLeastForRunsOutThen() throws Throwable {
    String name = "kept-at-least:" + System.nanoTime();
    PgFenceLockProvider provider = keptProvider();
    AtomicReference<PgFenceLock> seen = new AtomicReference<>();
    new DefaultLockingTaskExecutor(provider)
        .executeWithLock(
            (LockingTaskExecutor.Task) () -> seen.set(PgFenceLock.current().orElseThrow()),
            config(name, Duration.ofSeconds(6), Duration.ofSeconds(5)));
    assertTrue(
        provider.lock(config(name, Duration.ofSeconds(3), Duration.ZERO)).isEmpty(),
        "held for lockAtLeastFor");
    assertEquals(KeptLease.State.RELEASED, seen.get().keptLease().orElseThrow().state());
    await("the lease runs out (a renewal would keep it)", () -> live(provider, name).equals("0"));
    Optional<SimpleLock> again = provider.lock(config(name, Duration.ofSeconds(3), Duration.ZERO));
    assertTrue(again.isPresent());
    again.get().unlock();
  }
}
