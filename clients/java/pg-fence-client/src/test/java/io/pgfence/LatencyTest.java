package io.pgfence;

import static org.junit.jupiter.api.Assertions.assertTrue;

import com.zaxxer.hikari.HikariConfig;
import com.zaxxer.hikari.HikariDataSource;
import io.pgfence.testing.Cluster;
import io.pgfence.testing.Percentiles;
import java.sql.Connection;
import java.sql.SQLException;
import java.time.Duration;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * Acquire and release latency from Java, p50 and p99: one statement on one connection (durable and
 * fast leases), and through {@link FenceClient} over a HikariCP pool. Printed, not judged (but for
 * a sanity bound): the figures go to the README.
 */
class LatencyTest {
  private static final int SAMPLES = 500;
  private static Cluster cluster;

  @BeforeAll
  static void create() {
    cluster = new Cluster("latency", 27804).create();
  }

  @AfterAll
  static void destroy() {
    cluster.destroy();
  }

  @Test
  void acquireAndReleaseLatency() throws SQLException {
    try (Connection conn = cluster.connect("latency")) {
      measure("one connection, durable", AcquireOptions.ttl(Duration.ofSeconds(30)), conn);
      measure(
          "one connection, fast", AcquireOptions.ttl(Duration.ofSeconds(30)).durable(false), conn);
    }
    HikariConfig config = new HikariConfig();
    config.setJdbcUrl(cluster.url());
    config.setUsername("postgres");
    config.setMaximumPoolSize(2);
    try (HikariDataSource pool = new HikariDataSource(config);
        FenceClient client = new FenceClient(pool)) {
      long[] acquire = new long[SAMPLES];
      long[] release = new long[SAMPLES];
      AcquireOptions opts = AcquireOptions.ttl(Duration.ofSeconds(30));
      for (int i = 0; i < SAMPLES + 50; i++) {
        long start = System.nanoTime();
        Lease lease = client.acquire("pooled:" + i, opts).orElseThrow();
        long acquired = System.nanoTime();
        assertTrue(client.release(lease));
        long released = System.nanoTime();
        if (i >= 50) {
          acquire[i - 50] = acquired - start;
          release[i - 50] = released - acquired;
        }
      }
      print("FenceClient over HikariCP, durable", acquire, release);
    }
  }

  private static void measure(String what, AcquireOptions opts, Connection conn)
      throws SQLException {
    long[] acquire = new long[SAMPLES];
    long[] release = new long[SAMPLES];
    for (int i = 0; i < SAMPLES + 50; i++) {
      long start = System.nanoTime();
      Lease lease = PgFence.acquire(conn, what + ":" + i, opts).orElseThrow();
      long acquired = System.nanoTime();
      assertTrue(PgFence.release(conn, lease));
      long released = System.nanoTime();
      if (i >= 50) { // the first ones warm up the JIT and the server's plans
        acquire[i - 50] = acquired - start;
        release[i - 50] = released - acquired;
      }
    }
    print(what, acquire, release);
  }

  private static void print(String what, long[] acquire, long[] release) {
    System.out.printf(
        "[latency] %s: acquire %s; release %s%n",
        what, Percentiles.summary(acquire), Percentiles.summary(release));
    assertTrue(Percentiles.millis(acquire, 50) < 1000, "a sanity bound");
  }
}
