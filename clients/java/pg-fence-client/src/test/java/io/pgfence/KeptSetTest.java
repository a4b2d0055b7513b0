package io.pgfence;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pgfence.testing.Cluster;
import java.sql.Connection;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * A kept lease set: renewed as one, guarded per key, lost as a whole, the rest released at once.
 */
class KeptSetTest {
  private static Cluster cluster;

  @BeforeAll
  static void create() {
    cluster = new Cluster("kept_set", 27809).create();
  }

  @AfterAll
  static void destroy() {
    cluster.destroy();
  }

  @Test
  void aKeptSetIsRenewedGuardedAndLostAsAWhole() throws Exception {
    String run = "set:" + System.nanoTime();
    List<String> keys = List.of(run + ":b", run + ":a");
    try (FenceClient client = new FenceClient(cluster.dataSource("kept_set"))) {
      KeptLease set =
          client.holdAll(keys, AcquireOptions.ttl(Duration.ofMillis(1500)), KeepOptions.defaults());
      assertEquals(List.of(run + ":a", run + ":b"), set.keys(), "in key order");
      assertThrows(
          WaitTimedOutException.class,
          () ->
              client.holdAll(
                  keys, AcquireOptions.ttl(Duration.ofSeconds(5)), KeepOptions.defaults()));
      Thread.sleep(3000); // two ttls: renewed as one
      assertTrue(set.isHeld());
      try (Connection conn = cluster.connect("kept_set_writer")) {
        conn.setAutoCommit(false);
        for (String key : keys) {
          set.guard(conn, key);
        }
        conn.commit();
        assertThrows(IllegalArgumentException.class, () -> set.guard(conn, run + ":c"));
      }
      cluster.revoke(run + ":b");
      assertEquals(LossReason.REVOKED, set.lost().get(5, TimeUnit.SECONDS));
      assertFalse(set.isHeld());
      // The set is lost whole: its other lease is released by the keeper at once, not left to
      // expire (a second or more away: it was renewed at most 0.5 s before the loss).
      long end = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(300);
      while (!"f".equals(cluster.sql("SELECT live FROM fence.leases WHERE key = ?", run + ":a"))) {
        assertTrue(System.nanoTime() < end, "the rest of the set is still held");
        Thread.sleep(10);
      }
      assertFalse(set.release(), "nothing left to release");
      assertEquals(KeptLease.State.LOST, set.state());
    }
  }
}
