package io.pgfence;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.math.BigDecimal;
import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import org.junit.jupiter.api.Test;

/** What needs no server: intervals, JSON, backoff, options, reasons, the deadline's margin. */
class UnitTest {

  @Test
  void intervalsAreSecondsWithMicroseconds() {
    assertEquals("30.000000 seconds", Sql.interval(Duration.ofSeconds(30)));
    assertEquals("0.050000 seconds", Sql.interval(Duration.ofMillis(50)));
    assertEquals("0.000002 seconds", Sql.interval(Duration.ofNanos(1500)));
    assertEquals("-1.500000 seconds", Sql.interval(Duration.ofMillis(-1500)));
    assertEquals("86400.000000 seconds", Sql.interval(Duration.ofDays(1)));
  }

  @Test
  void jsonOfChangesAndFilters() {
    Map<String, Object> changes = new LinkedHashMap<>();
    changes.put("status", "paid \"now\"\n");
    changes.put("amount", new BigDecimal("120.50"));
    changes.put("count", 3);
    changes.put("ok", true);
    changes.put("note", null);
    changes.put("tags", List.of("a", 1));
    changes.put("id", UUID.fromString("6f0c7d1e-2b1a-4c3d-9e8f-0a1b2c3d4e5f"));
    assertEquals(
        "{\"status\":\"paid \\\"now\\\"\\n\",\"amount\":120.50,\"count\":3,\"ok\":true,"
            + "\"note\":null,\"tags\":[\"a\",1],\"id\":\"6f0c7d1e-2b1a-4c3d-9e8f-0a1b2c3d4e5f\"}",
        Json.of(changes));
    assertEquals("{\"c\":\"\\u0001\"}", Json.of(Map.of("c", "\u0001")));
    assertThrows(IllegalArgumentException.class, () -> Json.of(Map.of("x", Double.NaN)));
  }

  @Test
  void theCeilingDoublesUpToTheCap() {
    Backoff backoff =
        new Backoff(Duration.ofMillis(10), Duration.ofMillis(300), 5, Duration.ofDays(1));
    List<Long> ceilings = new java.util.ArrayList<>();
    for (int n = 0; n < 8; n++) {
      ceilings.add(backoff.ceiling(n).toMillis());
    }
    assertEquals(List.of(10L, 20L, 40L, 80L, 160L, 300L, 300L, 300L), ceilings);
    assertEquals(backoff.cap(), backoff.ceiling(200), "no overflow for huge retry counts");
  }

  @Test
  void fullJitterSpreadsOverZeroToTheCeiling() {
    Backoff backoff =
        new Backoff(Duration.ofMillis(10), Duration.ofMillis(300), 5, Duration.ofDays(1));
    for (int retry = 0; retry < 10; retry++) {
      long ceiling = backoff.ceiling(retry).toNanos();
      boolean low = false;
      boolean high = false;
      for (int i = 0; i < 2000; i++) {
        long delay = backoff.delay(retry).toNanos();
        assertTrue(delay >= 0 && delay <= ceiling, "retry " + retry + ": a delay out of range");
        low |= delay < ceiling / 4;
        high |= delay > ceiling * 3 / 4;
      }
      assertTrue(low && high, "retry " + retry + ": not spread over [0, ceiling]");
    }
  }

  @Test
  void retriesEndAfterMaxAttemptsOrMaxElapsed() {
    Backoff backoff =
        new Backoff(Duration.ofMillis(10), Duration.ofMillis(300), 5, Duration.ofDays(1));
    long now = System.nanoTime();
    for (int tries = 1; tries < 5; tries++) {
      assertTrue(backoff.next(tries, now) != null);
    }
    assertNull(backoff.next(5, now));
    Backoff timed =
        new Backoff(Duration.ofMillis(10), Duration.ofMillis(300), 0, Duration.ofMillis(50));
    assertNull(timed.next(1, now - Duration.ofSeconds(1).toNanos()));
    assertTrue(
        Backoff.defaults().next(1000, System.nanoTime()) != null,
        "only the time bounds the defaults");
  }

  @Test
  void optionsThatCannotWorkTogetherAreRefusedBeforeSending() {
    AcquireOptions opts = AcquireOptions.ttl(Duration.ofSeconds(30));
    opts.check();
    opts.shared(true).check();
    assertThrows(IllegalArgumentException.class, () -> opts.permits(0).check());
    assertThrows(IllegalArgumentException.class, () -> opts.shared(true).permits(2).check());
    assertThrows(IllegalArgumentException.class, () -> opts.token(UUID.randomUUID()).checkForSet());
    assertThrows(IllegalArgumentException.class, () -> opts.permits(2).checkForSet());
    UUID token = opts.withToken().token().orElseThrow();
    AcquireOptions tokened = opts.token(token);
    assertEquals(token, tokened.withToken().token().orElseThrow(), "a token is kept, not redrawn");
  }

  @Test
  void modesAreSentByNameAndOnlyWhenAskedFor() {
    AcquireOptions opts = AcquireOptions.ttl(Duration.ofSeconds(30));
    String plain = PgFence.acquireSql(opts);
    assertFalse(
        plain.contains("shared") || plain.contains("permits") || plain.contains("lock_delay"));
    assertTrue(PgFence.acquireSql(opts.shared(true)).endsWith("?::uuid, shared => ?)"));
    assertTrue(
        PgFence.acquireSql(opts.permits(2).lockDelay(Duration.ofSeconds(2)))
            .endsWith("?::uuid, permits => ?, lock_delay => ?::interval)"));
  }

  @Test
  void theServersReasonsAndAFastLeaseTheServerForgot() {
    assertEquals(LossReason.REVOKED, LossReason.ofStatus("revoked", true));
    assertEquals(LossReason.TAKEN_OVER, LossReason.ofStatus("taken_over", false));
    assertEquals(LossReason.UNKNOWN, LossReason.ofStatus("unknown", true));
    assertEquals(LossReason.RESTARTED, LossReason.ofStatus("unknown", false));
    assertNull(LossReason.ofStatus("released", true));
    assertEquals("session_ended", LossReason.SESSION_ENDED.wireName());
    assertEquals(LossReason.TAKEN_OVER, LossReason.fromWireName("taken_over"));
  }

  @Test
  void aRenewalPeriodThatLeavesNoTimeIsRefusedBeforeSending() {
    // A DataSource that must not be asked: nothing is sent for options that cannot work.
    javax.sql.DataSource none =
        new org.postgresql.ds.PGSimpleDataSource() {
          private static final long serialVersionUID = 1L;

          @Override
          public java.sql.Connection getConnection() {
            throw new AssertionError("nothing must be sent");
          }
        };
    try (FenceClient client = new FenceClient(none)) {
      AcquireOptions opts = AcquireOptions.ttl(Duration.ofSeconds(3));
      for (Duration every :
          List.of(Duration.ZERO, Duration.ofSeconds(3), Duration.ofMillis(2950))) {
        assertThrows(
            IllegalArgumentException.class,
            () -> client.hold("k", opts, KeepOptions.defaults().renewEvery(every)),
            every.toString());
      }
      assertThrows(
          IllegalArgumentException.class,
          () -> client.holdAll(List.of("a"), opts.shared(true), KeepOptions.defaults()));
    }
  }

  @Test
  void theDefaultMarginIs100msOrAThousandthOfLongTtls() {
    KeepOptions keep = KeepOptions.defaults();
    assertEquals(Duration.ofMillis(20), keep.marginFor(Duration.ofSeconds(1)));
    assertEquals(Duration.ofMillis(100), keep.marginFor(Duration.ofSeconds(30)));
    assertEquals(Duration.ofMillis(3600), keep.marginFor(Duration.ofHours(1)));
    assertEquals(Duration.ofSeconds(10), keep.renewEveryFor(Duration.ofSeconds(30)));
  }
}
