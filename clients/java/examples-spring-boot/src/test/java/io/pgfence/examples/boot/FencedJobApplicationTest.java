package io.pgfence.examples.boot;

import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pgfence.testing.Cluster;
import java.sql.Connection;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.springframework.boot.SpringApplication;
import org.springframework.context.ConfigurableApplicationContext;

/**
 * Two instances of the example application on one database: the job's rows come one fence after
 * another (no two rounds overlapped), written by the instances that held the lock.
 */
class FencedJobApplicationTest {
  private static Cluster cluster;

  @BeforeAll
  static void create() {
    int port = Integer.parseInt(System.getProperty("pgfence.test.port", "27833"));
    cluster = new Cluster("example_boot_" + port, port).create();
    cluster.sql(
        "CREATE TABLE report_runs (id bigserial PRIMARY KEY, fence bigint NOT NULL, instance text)");
  }

  @AfterAll
  static void destroy() {
    cluster.destroy();
  }

  private static ConfigurableApplicationContext start(String instance) {
    return SpringApplication.run(
        FencedJobApplication.class,
        "--spring.datasource.url=" + cluster.url(),
        "--spring.datasource.username=postgres",
        "--spring.main.banner-mode=off",
        "--logging.level.root=warn",
        "--report.every=50ms",
        "--report.instance=" + instance);
  }

  private static List<Long> fences() throws SQLException {
    List<Long> fences = new ArrayList<>();
    try (Connection conn = cluster.connect("example_test");
        Statement statement = conn.createStatement();
        ResultSet rows = statement.executeQuery("SELECT fence FROM report_runs ORDER BY id")) {
      while (rows.next()) {
        fences.add(rows.getLong(1));
      }
    }
    return fences;
  }

  @Test
  void twoInstancesRunTheJobOneAtATimeUnderRisingFences() throws Exception {
    List<Long> fences;
    try (ConfigurableApplicationContext a = start("a");
        ConfigurableApplicationContext b = start("b")) {
      long deadline = System.nanoTime() + Duration.ofSeconds(120).toNanos();
      while ((fences = fences()).size() < 20) {
        assertTrue(System.nanoTime() < deadline, "20 runs not within 120 s: " + fences.size());
        assertTrue(a.isRunning() && b.isRunning(), "an instance stopped");
        Thread.sleep(50);
      }
    }
    fences = fences();
    for (int i = 1; i < fences.size(); i++) {
      assertTrue(
          fences.get(i) > fences.get(i - 1),
          "run " + i + " wrote under fence " + fences.get(i) + " after " + fences.get(i - 1));
    }
    System.out.println("example: " + fences.size() + " runs, fences rising");
  }
}
