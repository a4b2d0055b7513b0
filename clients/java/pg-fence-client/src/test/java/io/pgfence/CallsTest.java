package io.pgfence;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pgfence.testing.Cluster;
import java.sql.Connection;
import java.sql.SQLException;
import java.sql.Statement;
import java.time.Duration;
import java.time.Instant;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.OptionalLong;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInfo;
import org.postgresql.util.PSQLException;

/** Every call of the SQL API, its answers and its typed errors, against a real server. */
class CallsTest {
  private static final Duration TTL = Duration.ofSeconds(30);
  private static Cluster cluster;

  @BeforeAll
  static void create() {
    cluster = new Cluster("calls", 27800).create();
  }

  @AfterAll
  static void destroy() {
    cluster.destroy();
  }

  private static String key(TestInfo info) {
    return info.getDisplayName() + ":" + System.nanoTime();
  }

  private static Connection connect() throws SQLException {
    return cluster.connect("calls");
  }

  @Test
  void acquireRenewReleaseAndARefusalIsEmpty(TestInfo info) throws SQLException {
    String key = key(info);
    try (Connection conn = connect()) {
      Lease lease = PgFence.acquire(conn, key, AcquireOptions.ttl(TTL).owner("a")).orElseThrow();
      assertEquals(key, lease.key());
      assertEquals("a", lease.owner());
      assertTrue(lease.fence() > 0);
      assertTrue(lease.expiresAt().isAfter(lease.acquiredAt()));
      assertTrue(lease.durable() && !lease.shared() && lease.permits() == 1);
      assertEquals(Optional.empty(), PgFence.acquire(conn, key, AcquireOptions.ttl(TTL)));
      Instant renewed = PgFence.renew(conn, lease, Duration.ofSeconds(60));
      assertTrue(renewed.isAfter(lease.expiresAt()));
      assertEquals(OptionalLong.of(lease.fence()), PgFence.currentFence(conn, key));
      assertTrue(PgFence.status(conn, key, lease.token()).isLive());
      assertTrue(PgFence.release(conn, lease));
      assertFalse(PgFence.release(conn, lease), "a second release holds nothing");
      LeaseStatus status = PgFence.status(conn, key, lease.token());
      assertEquals("released", status.reason());
      assertEquals(Optional.empty(), status.lossReason(true));
      LeaseLostException lost =
          assertThrows(LeaseLostException.class, () -> PgFence.renew(conn, lease, TTL));
      assertEquals("PF001", lost.getSQLState());
      assertEquals(Optional.empty(), lost.reason(), "one statement: no reason asked");
      Lease next = PgFence.acquire(conn, key, AcquireOptions.ttl(TTL)).orElseThrow();
      assertTrue(next.fence() > lease.fence());
      assertEquals(OptionalLong.empty(), PgFence.currentFence(conn, key + ":never"));
    }
  }

  @Test
  void theCallsTakePartInTheCallersTransaction(TestInfo info) throws SQLException {
    String key = key(info);
    try (Connection conn = connect()) {
      conn.setAutoCommit(false);
      Lease lease = PgFence.acquire(conn, key, AcquireOptions.ttl(TTL)).orElseThrow();
      conn.rollback();
      assertEquals(
          "unknown", PgFence.status(conn, key, lease.token()).reason(), "rolled back: no grant");
      conn.setAutoCommit(true);
    }
  }

  @Test
  void theTokenOfARetriedAcquireGetsItsOwnLeaseBack(TestInfo info) throws SQLException {
    String key = key(info);
    UUID token = UUID.randomUUID();
    try (Connection conn = connect()) {
      AcquireOptions opts = AcquireOptions.ttl(TTL).token(token);
      Lease first = PgFence.acquire(conn, key, opts).orElseThrow();
      Lease again = PgFence.acquire(conn, key, opts).orElseThrow();
      assertEquals(token, first.token());
      assertEquals(first.fence(), again.fence());
    }
  }

  @Test
  void theGuardRefusesAStaleFenceAndAnAutocommitGuard(TestInfo info) throws SQLException {
    String key = key(info);
    try (Connection conn = connect();
        Statement statement = conn.createStatement()) {
      statement.execute(
          "CREATE TABLE IF NOT EXISTS invoices (id int PRIMARY KEY, status text, fence bigint)");
      statement.execute("INSERT INTO invoices VALUES (42, 'new', NULL) ON CONFLICT DO NOTHING");
      Lease lease = PgFence.acquire(conn, key, AcquireOptions.ttl(TTL)).orElseThrow();
      assertThrows(
          IllegalStateException.class,
          () -> PgFence.fenceGuard(conn, key, lease.fence()),
          "a guard in a transaction of its own protects nothing");
      conn.setAutoCommit(false);
      PgFence.fenceGuard(conn, key, lease.fence());
      statement.execute("UPDATE invoices SET status = 'guarded' WHERE id = 42");
      conn.commit();
      assertEquals(
          1,
          PgFence.fencedUpdate(
              conn, key, lease.fence(), "invoices", Map.of("status", "paid"), Map.of("id", 42)));
      conn.commit();
      conn.setAutoCommit(true);
      cluster.revoke(key);
      conn.setAutoCommit(false);
      StaleFenceException stale =
          assertThrows(
              StaleFenceException.class, () -> PgFence.fenceGuard(conn, key, lease.fence()));
      assertEquals("PF002", stale.getSQLState());
      assertEquals(lease.fence(), stale.fence());
      conn.rollback();
      assertThrows(
          StaleFenceException.class,
          () ->
              PgFence.fencedUpdate(
                  conn, key, lease.fence(), "invoices", Map.of("status", "x"), Map.of("id", 42)));
      conn.rollback();
      conn.setAutoCommit(true);
      assertEquals("paid", cluster.sql("SELECT status FROM invoices WHERE id = 42"));
    }
  }

  @Test
  void fencedAndVersionedWrites() throws SQLException {
    try (Connection conn = connect();
        Statement statement = conn.createStatement()) {
      statement.execute(
          "CREATE TABLE docs (id int PRIMARY KEY, body text, fence bigint, version bigint)");
      statement.execute("INSERT INTO docs VALUES (1, 'a', NULL, 1)");
      assertEquals(
          1, PgFence.fencedWrite(conn, "docs", "fence", 10, Map.of("body", "b"), Map.of("id", 1)));
      StaleFenceException stale =
          assertThrows(
              StaleFenceException.class,
              () ->
                  PgFence.fencedWrite(
                      conn, "docs", "fence", 9, Map.of("body", "c"), Map.of("id", 1)));
      assertEquals(9, stale.fence());
      assertEquals(
          2,
          PgFence.versionedUpdate(
              conn, "docs", "version", 1, Map.of("body", "d"), Map.of("id", 1)));
      VersionConflictException conflict =
          assertThrows(
              VersionConflictException.class,
              () ->
                  PgFence.versionedUpdate(
                      conn, "docs", "version", 1, Map.of("body", "e"), Map.of("id", 1)));
      assertEquals("40001", conflict.getSQLState());
      PSQLException none =
          assertThrows(
              PSQLException.class,
              () ->
                  PgFence.versionedUpdate(
                      conn, "docs", "version", 2, Map.of("body", "e"), Map.of("id", 7)));
      assertEquals("P0002", none.getSQLState());
      assertEquals("d", cluster.sql("SELECT body FROM docs WHERE id = 1"));
    }
  }

  @Test
  void badInputIsTheServersOwnErrorWithItsSqlstate(TestInfo info) throws SQLException {
    String key = key(info);
    try (Connection conn = connect()) {
      PSQLException zero =
          assertThrows(
              PSQLException.class,
              () -> PgFence.acquire(conn, key, AcquireOptions.ttl(Duration.ZERO)));
      assertEquals("22023", zero.getSQLState());
      PSQLException empty =
          assertThrows(
              PSQLException.class, () -> PgFence.acquire(conn, "", AcquireOptions.ttl(TTL)));
      assertEquals("22023", empty.getSQLState());
      assertThrows(
          IllegalArgumentException.class,
          () -> PgFence.acquire(conn, key, AcquireOptions.ttl(TTL).permits(0)),
          "checked before anything is sent");
      conn.setReadOnly(true);
      conn.setAutoCommit(false);
      PSQLException readOnly =
          assertThrows(
              PSQLException.class, () -> PgFence.acquire(conn, key, AcquireOptions.ttl(TTL)));
      assertEquals("25006", readOnly.getSQLState());
      conn.rollback();
    }
  }

  @Test
  void aWaitingAcquireEndedByTheServerIsWaitCancelled(TestInfo info) throws Exception {
    String key = key(info);
    try (Connection holder = connect();
        Connection waiter = connect();
        Statement statement = waiter.createStatement()) {
      Lease held = PgFence.acquire(holder, key, AcquireOptions.ttl(TTL)).orElseThrow();
      statement.execute("SET statement_timeout = 200");
      WaitCancelledException cancelled =
          assertThrows(
              WaitCancelledException.class,
              () ->
                  PgFence.acquire(
                      waiter, key, AcquireOptions.ttl(TTL).waitFor(Duration.ofSeconds(10))));
      assertEquals("57014", cancelled.getSQLState());
      statement.execute("RESET statement_timeout");
      // A wait granted at the release.
      CompletableFuture<Optional<Lease>> waiting =
          CompletableFuture.supplyAsync(
              () -> {
                try {
                  return PgFence.acquire(
                      waiter, key, AcquireOptions.ttl(TTL).waitFor(Duration.ofSeconds(10)));
                } catch (SQLException e) {
                  throw new IllegalStateException(e);
                }
              });
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
      while (PgFence.waiters(holder, key) == 0 && System.nanoTime() < deadline) {
        Thread.sleep(10);
      }
      assertTrue(PgFence.release(holder, held));
      assertTrue(waiting.get(10, TimeUnit.SECONDS).orElseThrow().fence() > held.fence());
    }
  }

  @Test
  void sharedLeasesAndPermits(TestInfo info) throws SQLException {
    String key = key(info);
    try (Connection conn = connect()) {
      AcquireOptions reader = AcquireOptions.ttl(TTL).shared(true);
      Lease one = PgFence.acquire(conn, key, reader).orElseThrow();
      Lease two = PgFence.acquire(conn, key, reader).orElseThrow();
      assertTrue(one.shared() && two.fence() > one.fence());
      assertEquals(Optional.empty(), PgFence.acquire(conn, key, AcquireOptions.ttl(TTL)));
      String sem = key + ":sem";
      AcquireOptions permit = AcquireOptions.ttl(TTL).permits(2);
      Lease p1 = PgFence.acquire(conn, sem, permit).orElseThrow();
      PgFence.acquire(conn, sem, permit).orElseThrow();
      assertEquals(Optional.empty(), PgFence.acquire(conn, sem, permit));
      assertEquals(2, p1.permits());
      assertTrue(PgFence.release(conn, p1));
      assertTrue(PgFence.acquire(conn, sem, permit).isPresent());
    }
  }

  @Test
  void leaseSetsAllOrNone(TestInfo info) throws SQLException {
    String key = key(info);
    List<String> keys = List.of(key + ":b", key + ":a");
    try (Connection conn = connect()) {
      LeaseSet set = PgFence.acquireAll(conn, keys, AcquireOptions.ttl(TTL)).orElseThrow();
      assertEquals(List.of(key + ":a", key + ":b"), set.keys(), "in key order");
      assertTrue(set.fence(key + ":a").isPresent());
      assertEquals(Optional.empty(), PgFence.acquireAll(conn, keys, AcquireOptions.ttl(TTL)));
      assertTrue(PgFence.renewAll(conn, set, TTL).isAfter(Instant.now()));
      cluster.revoke(key + ":b");
      assertThrows(LeaseLostException.class, () -> PgFence.renewAll(conn, set, TTL));
      assertEquals(1, PgFence.releaseAll(conn, set));
      assertThrows(
          IllegalArgumentException.class,
          () -> PgFence.acquireAll(conn, keys, AcquireOptions.ttl(TTL).shared(true)));
    }
  }

  @Test
  void leadersProclaimsAndHandoffs(TestInfo info) throws Exception {
    String key = key(info);
    try (Connection conn = connect();
        Connection other = connect()) {
      assertEquals(Optional.empty(), PgFence.awaitChange(conn, key, null, Duration.ZERO));
      Lease lease = PgFence.acquire(conn, key, AcquireOptions.ttl(TTL).owner("v1")).orElseThrow();
      Leader leader = PgFence.awaitChange(conn, key, null, Duration.ZERO).orElseThrow();
      assertEquals(lease.fence(), leader.fence());
      assertEquals("v1", leader.owner());
      assertTrue(PgFence.proclaim(conn, lease, "v2"));
      assertEquals(
          "v2",
          PgFence.awaitChange(conn, key, leader, Duration.ofSeconds(5)).orElseThrow().owner());
      assertEquals(Optional.empty(), PgFence.handoff(conn, lease, "nobody"));
      CompletableFuture<Optional<Lease>> candidate =
          CompletableFuture.supplyAsync(
              () -> {
                try {
                  return PgFence.acquire(
                      other,
                      key,
                      AcquireOptions.ttl(TTL).owner("b").waitFor(Duration.ofSeconds(10)));
                } catch (SQLException e) {
                  throw new IllegalStateException(e);
                }
              });
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
      while (PgFence.waiters(conn, key) == 0 && System.nanoTime() < deadline) {
        Thread.sleep(10);
      }
      Leader next = PgFence.handoff(conn, lease, "b").orElseThrow();
      assertTrue(next.fence() > lease.fence());
      assertEquals(next.fence(), candidate.get(10, TimeUnit.SECONDS).orElseThrow().fence());
      assertEquals("released", PgFence.status(conn, key, lease.token()).reason());
    }
  }

  @Test
  void theClientRetriesAndExplainsALoss(TestInfo info) throws SQLException {
    String key = key(info);
    try (FenceClient client = new FenceClient(cluster.dataSource("calls_client"))) {
      Lease lease = client.acquire(key, AcquireOptions.ttl(TTL)).orElseThrow();
      assertEquals(Optional.empty(), client.acquire(key, AcquireOptions.ttl(TTL)));
      client.renew(lease, TTL);
      cluster.revoke(key);
      LeaseLostException lost =
          assertThrows(LeaseLostException.class, () -> client.renew(lease, TTL));
      assertEquals(Optional.of(LossReason.REVOKED), lost.reason());
      assertInstanceOf(SQLException.class, lost);
      assertFalse(client.release(lease));
      assertEquals(OptionalLong.of(lease.fence()), client.currentFence(key));
      assertEquals("revoked", client.status(key, lease.token()).reason());
    }
  }
}
