package io.pgfence;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import io.pgfence.testing.Cluster;
import java.time.Duration;
import java.time.Instant;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import javax.sql.DataSource;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * Observers and listeners that block or throw hold up no renewal: they are the application's, not
 * the keeper's.
 */
class ObserverTest {
  private static final Duration TTL = Duration.ofSeconds(2);

  private static Cluster cluster;

  @BeforeAll
  static void create() {
    cluster = new Cluster("observers", 27815).create();
  }

  @AfterAll
  static void destroy() {
    cluster.destroy();
  }

  /**
   * Waits until {@code renewals} counts {@code more} renewals past its value now and three TTLs
   * have passed, failing the moment one of {@code leases} is no longer held.
   */
  private static void stayHeld(AtomicInteger renewals, int more, KeptLease... leases)
      throws InterruptedException {
    int from = renewals.get();
    long start = System.nanoTime();
    long until = start + TimeUnit.SECONDS.toNanos(60);
    while (renewals.get() - from < more || System.nanoTime() - start < 3 * TTL.toNanos()) {
      for (KeptLease lease : leases) {
        if (!lease.isHeld()) {
          fail(lease + " ended while an observer misbehaved: " + lease.reason().orElse(null));
        }
      }
      assertTrue(System.nanoTime() < until, "no renewal in 60 s: " + (renewals.get() - from));
      Thread.sleep(20);
    }
  }

  /**
   * An observer that blocks in renewFinished for longer than the TTL, on the keeper's only
   * connection: the leases are still renewed, and stopRenewing returns.
   */
  @Test
  void aBlockingObserverHoldsUpNoRenewal() throws Exception {
    DataSource source = cluster.dataSource("observers_blocking");
    CountDownLatch blocked = new CountDownLatch(1);
    CountDownLatch unblock = new CountDownLatch(1);
    AtomicBoolean first = new AtomicBoolean(true);
    AtomicInteger renewals = new AtomicInteger();
    FenceObserver observer =
        new FenceObserver() {
          @Override
          public void renewFinished(Duration took, RenewOutcome outcome, int leases) {
            if (first.getAndSet(false)) {
              blocked.countDown();
              try {
                unblock.await(2, TimeUnit.MINUTES);
              } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
              }
            } else if (outcome == RenewOutcome.OK) {
              renewals.incrementAndGet();
            }
          }
        };
    try (FenceClient client = new FenceClient(source, source, 1)) {
      client.addObserver(observer);
      KeptLease one = client.hold("blocking-1", AcquireOptions.ttl(TTL), KeepOptions.defaults());
      KeptLease two = client.hold("blocking-2", AcquireOptions.ttl(TTL), KeepOptions.defaults());
      try {
        assertTrue(blocked.await(60, TimeUnit.SECONDS), "no renewal was told");
        Instant expiry = two.expiresAt();
        stayHeld(renewals, 3, one, two);
        assertTrue(two.expiresAt().isAfter(expiry), "the server's expiry did not move");
        CompletableFuture<Void> stopped = CompletableFuture.runAsync(one::stopRenewing);
        stopped.get(30, TimeUnit.SECONDS);
        assertEquals(KeptLease.State.RELEASED, one.state());
      } finally {
        unblock.countDown();
        one.release();
        two.release();
      }
    }
  }

  /** An observer that throws an Error at every renewal: the session-bound lease is kept on. */
  @Test
  void anObserversErrorEndsNoKeeping() throws Exception {
    AtomicInteger renewals = new AtomicInteger();
    FenceObserver observer =
        new FenceObserver() {
          @Override
          public void renewFinished(Duration took, RenewOutcome outcome, int leases) {
            renewals.incrementAndGet();
            throw new AssertionError("an observer's bug");
          }
        };
    try (FenceClient client = new FenceClient(cluster.dataSource("observers_error"))) {
      client.addObserver(observer);
      try (KeptLease bound =
              client.hold(
                  "error-bound",
                  AcquireOptions.ttl(TTL).sessionBound(true),
                  KeepOptions.defaults());
          KeptLease kept =
              client.hold("error-kept", AcquireOptions.ttl(TTL), KeepOptions.defaults())) {
        stayHeld(renewals, 6, bound, kept);
      }
    }
  }

  /**
   * A lease set lost while its listener throws an Error: the set's other leases are released at
   * once, not left granted until their TTL, and the loss is told on the lease.
   */
  @Test
  void aListenersErrorStillReleasesALostSet() throws Exception {
    Duration ttl = Duration.ofMinutes(2);
    AtomicInteger told = new AtomicInteger();
    KeepOptions keep =
        KeepOptions.defaults()
            .renewEvery(Duration.ofMillis(300))
            .onLost(
                (lease, reason) -> {
                  told.incrementAndGet();
                  throw new AssertionError("a listener's bug");
                });
    try (FenceClient client = new FenceClient(cluster.dataSource("listener_error"))) {
      try (KeptLease set =
          client.holdAll(List.of("set-error-1", "set-error-2"), AcquireOptions.ttl(ttl), keep)) {
        cluster.revoke("set-error-1");
        assertEquals(LossReason.REVOKED, set.lost().get(60, TimeUnit.SECONDS));
        long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
        String live = "";
        while (System.nanoTime() < until) {
          live =
              cluster.sql("SELECT count(*) FROM fence.leases WHERE key = 'set-error-2' AND live");
          if (live.equals("0")) {
            break;
          }
          Thread.sleep(50);
        }
        assertEquals("0", live, "the lost set's other lease, still granted for its TTL of " + ttl);
        assertEquals(1, told.get(), "the listener was told once");
      }
    }
  }
}
