package io.pgfence;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pgfence.testing.Cluster;
import io.pgfence.testing.Proxy;
import java.sql.Connection;
import java.time.Duration;
import java.util.UUID;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * A session-bound acquire whose reply is lost while its backend lives on, cut off (a partition on
 * the client's side only): the retry does not take that orphan's lease (bound to a session that
 * ends whenever the orphan does) but releases its token and asks with a fresh one, on its own
 * session; the kept lease then outlives the orphan.
 */
class OrphanTest {
  private static Cluster cluster;

  @BeforeAll
  static void create() {
    cluster = new Cluster("orphan", 27805).create();
  }

  @AfterAll
  static void destroy() {
    cluster.destroy();
  }

  @Test
  void aSessionBoundAcquireDoesNotTakeAnOrphansLease() throws Exception {
    String key = "orphan:" + System.nanoTime();
    UUID first = UUID.randomUUID();
    try (Proxy proxy = new Proxy(cluster.port());
        FenceClient client = new FenceClient(Cluster.dataSource("orphan", proxy.port()))) {
      proxy.orphan(true);
      proxy.dropReplyAfter("lease_acquire");
      AcquireOptions opts =
          AcquireOptions.ttl(Duration.ofSeconds(30)).sessionBound(true).token(first);
      try (KeptLease lease = client.hold(key, opts, KeepOptions.defaults())) {
        assertEquals(1, proxy.dropped(), "the first reply was lost");
        assertNotEquals(first, lease.token(), "a fresh token, not the orphan's");
        try (Connection conn = cluster.connect("orphan_check")) {
          assertEquals("released", PgFence.status(conn, key, first).reason());
        }
        proxy.closeOrphans(); // the orphaned backend ends now
        Thread.sleep(1000);
        assertTrue(lease.isHeld(), "bound to its own session, not the orphan's: " + lease.state());
        assertEquals(
            "t",
            cluster.sql(
                "SELECT live FROM fence.leases WHERE key = ? AND fence = ?", key, lease.fence()));
      }
    }
  }
}
