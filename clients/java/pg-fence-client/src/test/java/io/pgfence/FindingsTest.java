package io.pgfence;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pgfence.testing.Cluster;
import java.sql.Connection;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** Findings on the Java client (issue 41's and after), each a behaviour the README promises. */
class FindingsTest {
  private static Cluster cluster;

  @BeforeAll
  static void create() {
    cluster = new Cluster("findings", 27812).create();
  }

  @AfterAll
  static void destroy() {
    cluster.destroy();
  }

  /** A restart that outlasts a try's retries does not end the campaign: it goes on, and leads. */
  @Test
  void campaignOutlivesAServerRestart() throws Exception {
    String key = "restart";
    Lease other;
    try (Connection conn = cluster.connect("findings_other")) {
      other = PgFence.acquire(conn, key, AcquireOptions.ttl(Duration.ofSeconds(60))).orElseThrow();
    }
    Backoff brief =
        new Backoff(Duration.ofMillis(50), Duration.ofMillis(200), 0, Duration.ofSeconds(1));
    FenceClient client =
        new FenceClient(cluster.dataSource("findings_campaign"), brief, Duration.ofSeconds(5));
    CompletableFuture<Object> outcome = new CompletableFuture<>();
    try (Elector elector = new Elector(client, key, ElectorOptions.ttl(Duration.ofSeconds(3)))) {
      Thread campaign =
          new Thread(
              () -> {
                try {
                  outcome.complete(elector.campaign("c", Duration.ofSeconds(60)));
                } catch (Exception e) {
                  outcome.complete(e);
                }
              });
      campaign.start();
      long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
      while (!"1".equals(cluster.sql("SELECT fence.waiters(?)", key))) {
        assertTrue(System.nanoTime() < until, "the campaign never waited");
        Thread.sleep(10);
      }
      cluster.stop();
      Thread.sleep(3000);
      cluster.start();
      try (Connection conn = cluster.connect("findings_other")) {
        assertTrue(PgFence.release(conn, other));
      }
      Object result = outcome.get(30, TimeUnit.SECONDS);
      assertInstanceOf(Leadership.class, result, "the campaign ended with " + result);
      Leadership leadership = (Leadership) result;
      assertTrue(leadership.isLeader());
      leadership.close();
    } finally {
      client.close();
    }
  }

  /**
   * A grant that came after a wait longer than its TTL is held, and kept: the server starts a
   * waited grant's TTL when it grants, so a deadline counted from the acquire's send had passed.
   */
  @Test
  void aGrantAfterAWaitLongerThanItsTtlIsKept() throws Exception {
    for (boolean sessionBound : new boolean[] {false, true}) {
      String key = "waited-" + sessionBound;
      try (FenceClient holder = new FenceClient(cluster.dataSource("findings_first"));
          FenceClient client = new FenceClient(cluster.dataSource("findings_waited"))) {
        KeptLease first = holder.hold(key, AcquireOptions.ttl(Duration.ofSeconds(30)));
        CompletableFuture<Void> released =
            CompletableFuture.runAsync(
                () -> {
                  try {
                    Thread.sleep(3000);
                    first.close();
                  } catch (Exception e) {
                    throw new IllegalStateException(e);
                  }
                });
        KeptLease waited =
            client.hold(
                key,
                AcquireOptions.ttl(Duration.ofMillis(1500))
                    .waitFor(Duration.ofSeconds(20))
                    .sessionBound(sessionBound));
        released.get(10, TimeUnit.SECONDS);
        Thread.sleep(2000);
        assertTrue(waited.isHeld(), "session-bound " + sessionBound + ": told " + waited.reason());
        waited.close();
      }
    }
  }

  /** lost() after close() is cancelled, as the README says; so is a copy taken before it. */
  @Test
  void lostAfterCloseIsCancelled() throws Exception {
    try (FenceClient client = new FenceClient(cluster.dataSource("findings_lost"))) {
      KeptLease kept = client.hold("lost", AcquireOptions.ttl(Duration.ofSeconds(3)));
      CompletableFuture<LossReason> before = kept.lost();
      kept.close();
      assertTrue(kept.lost().isCancelled(), "after close");
      assertTrue(before.isCancelled(), "taken before close");
    }
  }

  /** A key this thread keeps already, and a key not free, are results, not exceptions. */
  @Test
  void heldAndNotFreeAreResults() throws Exception {
    try (FenceClient client = new FenceClient(cluster.dataSource("findings_results"))) {
      AcquireOptions opts =
          AcquireOptions.ttl(Duration.ofSeconds(3)).waitFor(Duration.ofSeconds(5));
      KeptLease kept = client.tryHold("results", opts, KeepOptions.defaults()).orElseThrow();
      long started = System.nanoTime();
      assertFalse(client.tryHold("results", opts, KeepOptions.defaults()).isPresent());
      assertTrue(
          System.nanoTime() - started < TimeUnit.SECONDS.toNanos(4),
          "waited for itself the whole wait");
      CompletableFuture<Boolean> other = new CompletableFuture<>();
      Thread thread =
          new Thread(
              () -> {
                try {
                  other.complete(
                      client
                          .tryHold(
                              "results",
                              AcquireOptions.ttl(Duration.ofSeconds(3)),
                              KeepOptions.defaults())
                          .isPresent());
                } catch (Exception e) {
                  other.completeExceptionally(e);
                }
              });
      thread.start();
      assertEquals(false, other.get(10, TimeUnit.SECONDS), "not free: empty");
      kept.close();
    }
  }

  /** The onNewLeader thread tells its blindness (onBlind), then the leader again once it sees. */
  @Test
  void theWatcherSaysWhenItCannotSee() throws Exception {
    String key = "watched";
    java.util.concurrent.LinkedBlockingQueue<Object> told =
        new java.util.concurrent.LinkedBlockingQueue<>();
    FenceClient leaderClient = new FenceClient(cluster.dataSource("findings_leader"));
    try (io.pgfence.testing.Proxy proxy = new io.pgfence.testing.Proxy(cluster.port());
        Elector leading =
            new Elector(leaderClient, key, ElectorOptions.ttl(Duration.ofSeconds(2)));
        Leadership leadership = leading.campaign("a");
        FenceClient client = new FenceClient(Cluster.dataSource("findings_watch", proxy.port()));
        Elector watching =
            new Elector(
                client,
                key,
                ElectorOptions.ttl(Duration.ofSeconds(2))
                    .onNewLeader(leader -> told.add(leader.map(Leader::owner)))
                    .onBlind(told::add))) {
      assertEquals(java.util.Optional.of("a"), told.poll(10, TimeUnit.SECONDS), watching.key());
      Thread.sleep(100);
      proxy.hangExisting();
      assertInstanceOf(ObserverBlindException.class, told.poll(10, TimeUnit.SECONDS));
      assertEquals(java.util.Optional.of("a"), told.poll(10, TimeUnit.SECONDS), "sees again");
      assertTrue(leadership.isLeader());
    } finally {
      leaderClient.close();
    }
  }
}
