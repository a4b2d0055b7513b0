package io.pgfence.examples;

import io.pgfence.FenceClient;
import io.pgfence.StaleFenceException;
import io.pgfence.shedlock.PgFenceLock;
import io.pgfence.shedlock.PgFenceLockProvider;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.time.Duration;
import java.time.Instant;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import javax.sql.DataSource;
import net.javacrumbs.shedlock.core.DefaultLockingTaskExecutor;
import net.javacrumbs.shedlock.core.LockConfiguration;
import net.javacrumbs.shedlock.core.LockingTaskExecutor;

/**
 * A singleton scheduled job under ShedLock with the pg_fence provider: three instances fire the job
 * at every tick, one runs it, the others skip it; its write is guarded by its lock's fence. Then
 * one run hangs past lockAtMostFor while another instance runs the job: the hung run's late write
 * is refused.
 *
 * <pre>
 * java io.pgfence.examples.SingletonJob 'jdbc:postgresql://127.0.0.1:5432/postgres?user=postgres'
 * </pre>
 */
public final class SingletonJob {
  private SingletonJob() {}

  public static void main(String[] args) throws Throwable {
    String url = Db.url(args);
    Db.execute(
        url,
        "CREATE TABLE IF NOT EXISTS job_runs (id int PRIMARY KEY, runs int NOT NULL, fence bigint)",
        "INSERT INTO job_runs VALUES (1, 0, 0) ON CONFLICT (id) DO UPDATE SET runs = 0");
    DataSource source = Db.source(url, "singleton_job");
    String name = "report:" + System.nanoTime();
    AtomicInteger refused = new AtomicInteger();
    try (FenceClient client = new FenceClient(source)) {
      LockingTaskExecutor[] instances = new LockingTaskExecutor[3];
      for (int i = 0; i < instances.length; i++) {
        instances[i] = new DefaultLockingTaskExecutor(new PgFenceLockProvider(client, "job:"));
      }
      int ran = 0;
      int skipped = 0;
      long started = System.nanoTime();
      for (int tick = 0; tick < 5; tick++) {
        for (LockingTaskExecutor instance : instances) {
          // lockAtLeastFor keeps the lock past the run, so the other instances skip this tick
          // (if they fire within half a second of the first, as a schedule's instances do).
          LockConfiguration config =
              new LockConfiguration(
                  Instant.now(), name, Duration.ofSeconds(5), Duration.ofMillis(500));
          boolean executed = instance.executeWithLock(() -> write(source), config).wasExecuted();
          ran += executed ? 1 : 0;
          skipped += executed ? 0 : 1;
        }
        // The next tick a second after this one began, when this tick's lock has been free a while.
        long next = started + (tick + 1) * 1_000_000_000L;
        Thread.sleep(Math.max(0, (next - System.nanoTime()) / 1_000_000));
      }
      System.out.printf("ticks 5: runs %d, skipped %d%n", ran, skipped);

      CountDownLatch running = new CountDownLatch(1);
      CountDownLatch ranElsewhere = new CountDownLatch(1);
      Thread hung =
          new Thread(
              () -> {
                try {
                  instances[0].executeWithLock(
                      () -> {
                        running.countDown();
                        // Paused past lockAtMostFor (300 ms), as by a GC pause or a slow call,
                        // until another instance has run the job meanwhile.
                        ranElsewhere.await(10, TimeUnit.SECONDS);
                        try {
                          return write(source);
                        } catch (StaleFenceException stale) {
                          refused.incrementAndGet();
                          System.out.println(
                              "late write refused: fence " + stale.fence() + " is stale");
                          return false;
                        }
                      },
                      new LockConfiguration(
                          Instant.now(), name, Duration.ofMillis(300), Duration.ZERO));
                } catch (Throwable e) {
                  throw new IllegalStateException(e);
                }
              });
      hung.start();
      running.await(10, TimeUnit.SECONDS);
      Thread.sleep(400);
      boolean tookOver =
          instances[2]
              .executeWithLock(
                  () -> write(source),
                  new LockConfiguration(Instant.now(), name, Duration.ofSeconds(5), Duration.ZERO))
              .wasExecuted();
      ranElsewhere.countDown();
      hung.join();
      System.out.printf(
          "another instance ran the job meanwhile: %s; stale writes refused %d; rows say runs %s%n",
          tookOver, refused.get(), Db.value(url, "SELECT runs FROM job_runs WHERE id = 1"));
    }
  }

  /** The job's write, guarded by the fence of the lock its instance holds. */
  private static boolean write(DataSource source) throws SQLException {
    PgFenceLock lock = PgFenceLock.current().orElseThrow();
    try (Connection conn = source.getConnection()) {
      conn.setAutoCommit(false);
      lock.guard(conn);
      try (PreparedStatement update =
          conn.prepareStatement("UPDATE job_runs SET runs = runs + 1, fence = ? WHERE id = 1")) {
        update.setLong(1, lock.fence());
        update.executeUpdate();
      }
      conn.commit();
    }
    return true;
  }
}
