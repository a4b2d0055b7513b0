package io.pgfence.shedlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pgfence.FenceClient;
import io.pgfence.LossReason;
import io.pgfence.testing.Cluster;
import java.lang.reflect.InvocationHandler;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Proxy;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.time.Duration;
import java.time.Instant;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import javax.sql.DataSource;
import net.javacrumbs.shedlock.core.LockConfiguration;
import net.javacrumbs.shedlock.core.SimpleLock;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** An extension whose reply arrives after the old lockAtMostFor ran out. */
class ExtendTest {
  /** Generous: the machine may be loaded; only a hang takes this long. */
  private static final long BOUND_SECONDS = 60;

  private static Cluster cluster;

  @BeforeAll
  static void create() {
    cluster = new Cluster("shedlock_extend", 27826).create();
  }

  @AfterAll
  static void destroy() {
    cluster.destroy();
  }

  /**
   * {@code target}'s connections, whose lease_renew replies are held (once the server has renewed)
   * while {@code hold} is set: {@code held} counts down, and the reply waits for {@code release}.
   */
  private static DataSource holdingRenewReplies(
      DataSource target, AtomicBoolean hold, CountDownLatch held, CountDownLatch release) {
    return proxy(
        DataSource.class,
        target,
        (method, args, result) ->
            method.equals("getConnection")
                ? proxy(
                    Connection.class,
                    (Connection) result,
                    (connMethod, connArgs, statement) -> {
                      if (!connMethod.equals("prepareStatement")
                          || !((String) connArgs[0]).contains("fence.lease_renew(")) {
                        return statement;
                      }
                      return proxy(
                          PreparedStatement.class,
                          (PreparedStatement) statement,
                          (statementMethod, statementArgs, rows) -> {
                            if (statementMethod.equals("executeQuery") && hold.getAndSet(false)) {
                              held.countDown();
                              release.await(BOUND_SECONDS, TimeUnit.SECONDS);
                            }
                            return rows;
                          });
                    })
                : result);
  }

  private interface After {
    Object after(String method, Object[] args, Object result) throws Exception;
  }

  private static <T> T proxy(Class<T> type, T target, After after) {
    InvocationHandler handler =
        (self, method, args) -> {
          Object result;
          try {
            result = method.invoke(target, args);
          } catch (InvocationTargetException e) {
            throw e.getCause();
          }
          return after.after(method.getName(), args, result);
        };
    return type.cast(
        Proxy.newProxyInstance(ExtendTest.class.getClassLoader(), new Class<?>[] {type}, handler));
  }

  /**
   * The old lockAtMostFor runs out while the extension's renewal, done on the server, waits for its
   * reply: the lock is told EXPIRED meanwhile, and is held again once the extension returns.
   */
  @Test
  void anExtensionAnsweredAfterTheOldDeadlineKeepsTheLock() throws Exception {
    AtomicBoolean hold = new AtomicBoolean();
    CountDownLatch held = new CountDownLatch(1);
    CountDownLatch release = new CountDownLatch(1);
    DataSource source =
        holdingRenewReplies(cluster.dataSource("shedlock_extend"), hold, held, release);
    try (FenceClient client = new FenceClient(source)) {
      PgFenceLockProvider provider = PgFenceLockProvider.builder(client).build();
      String name = "extend:" + System.nanoTime();
      PgFenceLock lock =
          (PgFenceLock)
              provider
                  .lock(
                      new LockConfiguration(
                          Instant.now(), name, Duration.ofSeconds(2), Duration.ZERO))
                  .orElseThrow();
      CompletableFuture<LossReason> lost = lock.lost();
      // Watched from another thread: the extension runs on this one, the lock's own.
      CompletableFuture<LossReason> toldMeanwhile =
          CompletableFuture.supplyAsync(
              () -> {
                try {
                  if (!held.await(BOUND_SECONDS, TimeUnit.SECONDS)) {
                    return null;
                  }
                  return lost.get(BOUND_SECONDS, TimeUnit.SECONDS);
                } catch (Exception e) {
                  return null;
                } finally {
                  release.countDown();
                }
              });
      hold.set(true);
      Optional<SimpleLock> extension = lock.extend(Duration.ofSeconds(60), Duration.ZERO);
      assertEquals(
          LossReason.EXPIRED,
          toldMeanwhile.get(BOUND_SECONDS, TimeUnit.SECONDS),
          "the old deadline did not pass while the renewal's reply was held");
      PgFenceLock extended = (PgFenceLock) extension.orElseThrow();
      assertEquals(Optional.empty(), extended.reason(), "the extended lock's loss");
      assertTrue(extended.isHeld(), "the extended lock is not held");
      assertFalse(extended.lost().isDone(), "the extended lock's lost() is done");
      extended.unlock();
    }
  }
}
