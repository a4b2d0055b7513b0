package io.pgfence;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
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
 * A reply lost after the server committed the grant (a proxy drops it and closes both sides): the
 * retried acquire carries the same token and gets that very lease; when every retry's reply is
 * lost, the unknown outcome carries the token, to release or ask about.
 */
class LostReplyTest {
  private static Cluster cluster;

  @BeforeAll
  static void create() {
    cluster = new Cluster("lost_reply", 27801).create();
  }

  @AfterAll
  static void destroy() {
    cluster.destroy();
  }

  @Test
  void aLostReplyIsAnsweredByTheRetriedAcquire() throws Exception {
    String key = "lost-reply:" + System.nanoTime();
    try (Proxy proxy = new Proxy(cluster.port());
        FenceClient client = new FenceClient(Cluster.dataSource("lost_reply", proxy.port()))) {
      proxy.dropReplyAfter("lease_acquire");
      Lease lease = client.acquire(key, AcquireOptions.ttl(Duration.ofSeconds(30))).orElseThrow();
      assertEquals(1, proxy.dropped(), "the first reply was lost");
      assertEquals(
          String.valueOf(lease.fence()),
          cluster.sql("SELECT fence FROM fence.leases WHERE key = ? AND live", key),
          "the lease the lost reply granted, and no other");
      assertEquals("1", cluster.sql("SELECT count(*) FROM fence.leases WHERE key = ?", key));
      assertTrue(client.release(lease));
    }
  }

  @Test
  void anUnknownOutcomeCarriesTheToken() throws Exception {
    String key = "unknown-outcome:" + System.nanoTime();
    UUID token = UUID.randomUUID();
    Backoff quick =
        new Backoff(Duration.ofMillis(10), Duration.ofMillis(50), 3, Duration.ofSeconds(5));
    try (Proxy proxy = new Proxy(cluster.port());
        FenceClient client =
            new FenceClient(
                Cluster.dataSource("lost_reply", proxy.port()), quick, Duration.ofSeconds(5))) {
      proxy.dropEveryReply(true);
      proxy.dropReplyAfter("lease_acquire");
      OutcomeUnknownException unknown =
          assertThrows(
              OutcomeUnknownException.class,
              () -> client.acquire(key, AcquireOptions.ttl(Duration.ofSeconds(30)).token(token)));
      assertEquals(token, unknown.token().orElseThrow());
      assertEquals(3, proxy.dropped());
      try (Connection conn = cluster.connect("lost_reply_check")) {
        assertTrue(PgFence.status(conn, key, token).isLive(), "the first try granted it");
        assertTrue(PgFence.release(conn, key, token), "the token releases it");
      }
    }
  }
}
