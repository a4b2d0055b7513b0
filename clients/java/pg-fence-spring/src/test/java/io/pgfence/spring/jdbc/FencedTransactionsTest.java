package io.pgfence.spring.jdbc;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pgfence.AcquireOptions;
import io.pgfence.FenceClient;
import io.pgfence.KeepOptions;
import io.pgfence.KeptLease;
import io.pgfence.testing.Cluster;
import java.sql.Connection;
import java.sql.SQLException;
import java.time.Duration;
import java.util.concurrent.atomic.AtomicBoolean;
import javax.sql.DataSource;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.jdbc.datasource.DataSourceTransactionManager;
import org.springframework.jdbc.datasource.DelegatingDataSource;

/** FencedTransactions guards the transaction's own connection, or refuses. */
class FencedTransactionsTest {
  private static Cluster cluster;

  @BeforeAll
  static void create() throws Exception {
    cluster = new Cluster("spring_jdbc", 27816).create();
    cluster.sql("CREATE TABLE jobs (id int PRIMARY KEY, v text)");
  }

  @AfterAll
  static void destroy() {
    cluster.destroy();
  }

  /** Connections out of autocommit, as a pool configured so (Hikari's autoCommit=false) gives. */
  private static DataSource manual(DataSource target) {
    return new DelegatingDataSource(target) {
      @Override
      public Connection getConnection() throws SQLException {
        Connection conn = super.getConnection();
        conn.setAutoCommit(false);
        return conn;
      }
    };
  }

  @Test
  void guardsTheTransactionsConnection() throws Exception {
    DataSource dataSource = manual(cluster.dataSource("spring_jdbc_tx"));
    FencedTransactions fenced =
        new FencedTransactions(new DataSourceTransactionManager(dataSource), dataSource);
    JdbcTemplate jdbc = new JdbcTemplate(dataSource);
    try (FenceClient client = new FenceClient(cluster.dataSource("spring_jdbc_client"));
        KeptLease kept =
            client.hold(
                "same", AcquireOptions.ttl(Duration.ofSeconds(30)), KeepOptions.defaults())) {
      fenced.executeWithoutResult(
          kept::guard, status -> jdbc.update("INSERT INTO jobs VALUES (1, 'guarded')"));
    }
    assertEquals("guarded", cluster.sql("SELECT v FROM jobs WHERE id = 1"));
  }

  /**
   * A transaction manager of another DataSource: the guard would run in a transaction of its own on
   * this one while the callback's writes commit on the other, unguarded. Refused before the
   * callback runs.
   */
  @Test
  void refusesATransactionOnAnotherDataSource() throws Exception {
    DataSource transactions = manual(cluster.dataSource("spring_jdbc_tm"));
    DataSource other = manual(cluster.dataSource("spring_jdbc_other"));
    FencedTransactions fenced =
        new FencedTransactions(new DataSourceTransactionManager(transactions), other);
    JdbcTemplate jdbc = new JdbcTemplate(transactions);
    AtomicBoolean ran = new AtomicBoolean();
    try (FenceClient client = new FenceClient(cluster.dataSource("spring_jdbc_client"));
        KeptLease kept =
            client.hold(
                "other", AcquireOptions.ttl(Duration.ofSeconds(30)), KeepOptions.defaults())) {
      IllegalStateException refused = null;
      try {
        fenced.executeWithoutResult(
            kept::guard,
            status -> {
              ran.set(true);
              jdbc.update("INSERT INTO jobs VALUES (2, 'unguarded')");
            });
      } catch (IllegalStateException e) {
        refused = e;
      }
      assertNull(
          cluster.sql("SELECT v FROM jobs WHERE id = 2"),
          "the callback's write committed with no guard on its transaction");
      assertFalse(ran.get(), "the callback ran with no guard on its transaction");
      assertNotNull(refused, "no IllegalStateException");
      assertTrue(
          refused.getMessage().contains("DataSource of the transaction manager"),
          refused.getMessage());
    }
  }
}
