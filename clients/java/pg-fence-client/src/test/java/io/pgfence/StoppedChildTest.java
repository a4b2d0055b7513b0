package io.pgfence;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pgfence.testing.Cluster;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * A child JVM holding a lease is stopped (SIGSTOP) past its TTL; another holder takes over and
 * writes; on SIGCONT the child is told (unknown: its deadline passed) before or at its next write,
 * which never reaches the data, and a write it sends anyway with the old fence is refused (PF002).
 */
class StoppedChildTest {
  private static Cluster cluster;

  @BeforeAll
  static void create() {
    cluster = new Cluster("stopped_child", 27803).create();
    cluster.sql("CREATE TABLE child_writes (id int PRIMARY KEY, writer text, fence bigint)");
    cluster.sql("INSERT INTO child_writes VALUES (1, 'nobody', 0)");
  }

  @AfterAll
  static void destroy() {
    cluster.destroy();
  }

  @Test
  void aStoppedChildIsToldBeforeItsNextWriteWhichIsRefused() throws Exception {
    String key = "stopped-child:" + System.nanoTime();
    String java = ProcessHandle.current().info().command().orElse("java");
    String classpath =
        System.getProperty("surefire.test.class.path", System.getProperty("java.class.path"));
    Process child =
        new ProcessBuilder(
                java,
                "-cp",
                classpath,
                StoppedHolder.class.getName(),
                String.valueOf(cluster.port()),
                key,
                "2000")
            .redirectErrorStream(true)
            .start();
    BlockingQueue<String> lines = new LinkedBlockingQueue<>();
    Thread reader =
        new Thread(
            () -> {
              try (BufferedReader out =
                  new BufferedReader(
                      new InputStreamReader(child.getInputStream(), StandardCharsets.UTF_8))) {
                String line;
                while ((line = out.readLine()) != null) {
                  lines.add(line);
                }
              } catch (java.io.IOException ignored) {
                // The child ended.
              }
            });
    reader.start();
    try {
      String held = next(lines);
      assertTrue(held.startsWith("HELD "), held);
      long childFence = Long.parseLong(held.substring(5));
      assertTrue(next(lines).startsWith("WROTE"));
      // Stopped between two writes (it sleeps 300 ms after each), not in the middle of one.
      assertTrue(next(lines).startsWith("WROTE"));
      new ProcessBuilder("kill", "-STOP", String.valueOf(child.pid())).start().waitFor();
      long stopped = System.nanoTime();
      Lease taker;
      try (Connection conn = cluster.connect("taker")) {
        taker =
            PgFence.acquire(
                    conn,
                    key,
                    AcquireOptions.ttl(Duration.ofSeconds(30)).waitFor(Duration.ofSeconds(10)))
                .orElseThrow();
        assertTrue(taker.fence() > childFence);
        conn.setAutoCommit(false);
        PgFence.fenceGuard(conn, key, taker.fence());
        try (var statement =
            conn.prepareStatement(
                "UPDATE child_writes SET writer = 'taker', fence = ? WHERE id = 1")) {
          statement.setLong(1, taker.fence());
          statement.executeUpdate();
        }
        conn.commit();
      }
      System.out.printf(
          "[stopped child] taken over %.0f ms after the SIGSTOP (ttl 2000 ms)%n",
          (System.nanoTime() - stopped) / 1e6);
      Thread.sleep(500);
      new ProcessBuilder("kill", "-CONT", String.valueOf(child.pid())).start().waitFor();
      List<String> after = new ArrayList<>();
      String line;
      while ((line = lines.poll(10, TimeUnit.SECONDS)) != null) {
        after.add(line);
        if (line.startsWith("REFUSED_BY_SERVER") || line.equals("WROTE_STALE")) {
          break;
        }
      }
      System.out.println("[stopped child] after SIGCONT: " + after);
      // Told (the listener) and refused locally, in either order: the deadline's timer and the
      // writer both wake on SIGCONT. Then the server refuses the old fence. Nothing written.
      assertEquals(3, after.size(), "after SIGCONT: " + after);
      assertEquals(
          Set.of("TOLD unreachable", "REFUSED_LOCALLY unreachable"),
          Set.copyOf(after.subList(0, 2)),
          "told unknown (unreachable) at or before its next write");
      assertEquals("REFUSED_BY_SERVER PF002", after.get(2));
      assertEquals("taker", cluster.sql("SELECT writer FROM child_writes WHERE id = 1"));
      assertTrue(child.waitFor(10, TimeUnit.SECONDS));
    } finally {
      new ProcessBuilder("kill", "-CONT", String.valueOf(child.pid())).start().waitFor();
      child.destroyForcibly();
    }
  }

  private static String next(BlockingQueue<String> lines) throws InterruptedException {
    String line = lines.poll(20, TimeUnit.SECONDS);
    assertTrue(line != null, "the child said nothing");
    return line;
  }
}
