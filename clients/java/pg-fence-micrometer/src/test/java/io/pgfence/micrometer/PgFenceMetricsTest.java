package io.pgfence.micrometer;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.micrometer.core.instrument.Gauge;
import io.micrometer.core.instrument.Tags;
import io.micrometer.core.instrument.Timer;
import io.micrometer.core.instrument.simple.SimpleMeterRegistry;
import io.pgfence.AcquireOptions;
import io.pgfence.Elector;
import io.pgfence.ElectorOptions;
import io.pgfence.FenceClient;
import io.pgfence.KeepOptions;
import io.pgfence.KeptLease;
import io.pgfence.Leadership;
import io.pgfence.Lease;
import io.pgfence.LossReason;
import io.pgfence.testing.Cluster;
import java.time.Duration;
import java.util.Optional;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** The meters of a client against a real server, read from a {@link SimpleMeterRegistry}. */
class PgFenceMetricsTest {
  private static Cluster cluster;

  @BeforeAll
  static void create() {
    cluster = new Cluster("micrometer", 27813).create();
  }

  @AfterAll
  static void destroy() {
    cluster.destroy();
  }

  private static String key(String name) {
    return "metrics:" + name + ":" + System.nanoTime();
  }

  /** Waits (generously: the machine may be loaded) until {@code condition} holds. */
  private static void await(BooleanSupplier condition, String what) throws InterruptedException {
    long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
    while (!condition.getAsBoolean()) {
      assertTrue(System.nanoTime() < end, "not within 30 s: " + what);
      Thread.sleep(10);
    }
  }

  private static Timer timer(SimpleMeterRegistry registry, String name, String outcome) {
    Timer timer = registry.find(name).tag("outcome", outcome).timer();
    assertNotNull(timer, name + " " + outcome + " is not registered");
    return timer;
  }

  private static double kept(SimpleMeterRegistry registry) {
    return registry.get("pgfence.leases.kept").gauge().value();
  }

  @Test
  void acquiresAreTimedByOutcome() throws Exception {
    String key = key("acquire");
    SimpleMeterRegistry registry = new SimpleMeterRegistry();
    try (FenceClient client = new FenceClient(cluster.dataSource("metrics_acquire"));
        PgFenceMetrics metrics = new PgFenceMetrics(client)) {
      metrics.bindTo(registry);
      assertEquals(0, timer(registry, "pgfence.acquire", "granted").count(), "zero before");
      assertEquals(0, timer(registry, "pgfence.acquire", "refused").count(), "zero before");
      Optional<Lease> first = client.acquire(key, AcquireOptions.ttl(Duration.ofSeconds(30)));
      assertTrue(first.isPresent());
      Optional<Lease> second =
          client.acquire(
              key, AcquireOptions.ttl(Duration.ofSeconds(30)).waitFor(Duration.ofMillis(200)));
      assertTrue(second.isEmpty());
      Timer granted = timer(registry, "pgfence.acquire", "granted");
      Timer refused = timer(registry, "pgfence.acquire", "refused");
      assertEquals(1, granted.count());
      assertEquals(1, refused.count());
      assertEquals(0, timer(registry, "pgfence.acquire", "error").count());
      assertTrue(granted.totalTime(TimeUnit.NANOSECONDS) > 0, "a grant takes some time");
      // The refused acquire waited 200 ms for the key: its time counts the wait.
      assertTrue(
          refused.totalTime(TimeUnit.MILLISECONDS) >= 199,
          "refused after its wait: " + refused.totalTime(TimeUnit.MILLISECONDS) + " ms");
      client.release(first.get());
    }
  }

  @Test
  void keptLeasesAreCountedUpAndDownAndRenewalsTimed() throws Exception {
    SimpleMeterRegistry registry = new SimpleMeterRegistry();
    try (FenceClient client = new FenceClient(cluster.dataSource("metrics_kept"));
        PgFenceMetrics metrics = new PgFenceMetrics(client, Tags.of("client", "kept"))) {
      metrics.bindTo(registry);
      assertEquals(0, kept(registry));
      AcquireOptions opts = AcquireOptions.ttl(Duration.ofMillis(900));
      KeptLease a = client.hold(key("kept-a"), opts, KeepOptions.defaults());
      KeptLease b = client.hold(key("kept-b"), opts, KeepOptions.defaults());
      assertEquals(2, kept(registry));
      assertEquals("kept", registry.get("pgfence.leases.kept").gauge().getId().getTag("client"));
      // Renewed every 300 ms: the keeper's calls are timed, with how many leases each renewed.
      await(() -> timer(registry, "pgfence.renew", "ok").count() >= 2, "two renewals");
      assertTrue(registry.get("pgfence.renew.leases").summary().totalAmount() >= 2);
      assertEquals(0, timer(registry, "pgfence.renew", "lost").count());
      a.release();
      assertEquals(1, kept(registry));
      b.close();
      assertEquals(0, kept(registry));
      b.close();
      assertEquals(0, kept(registry), "ended once");
      assertEquals(
          0.0,
          registry.find("pgfence.lease.losses").counters().stream()
              .mapToDouble(c -> c.count())
              .sum(),
          "a release is no loss");
    }
  }

  @Test
  void aSessionBoundLeasesRenewalsAreTimedToo() throws Exception {
    SimpleMeterRegistry registry = new SimpleMeterRegistry();
    try (FenceClient client = new FenceClient(cluster.dataSource("metrics_bound"));
        PgFenceMetrics metrics = new PgFenceMetrics(client)) {
      metrics.bindTo(registry);
      // Renewed on its own session, not by the keeper's batches.
      try (KeptLease lease =
          client.hold(
              key("bound"),
              AcquireOptions.ttl(Duration.ofMillis(900)).sessionBound(true),
              KeepOptions.defaults())) {
        assertEquals(1, kept(registry));
        await(() -> timer(registry, "pgfence.renew", "ok").count() >= 2, "two renewals");
        assertTrue(lease.isHeld());
      }
      assertEquals(0, kept(registry));
    }
  }

  @Test
  void aLossIsCountedWithItsReason() throws Exception {
    String key = key("loss");
    SimpleMeterRegistry registry = new SimpleMeterRegistry();
    try (FenceClient client = new FenceClient(cluster.dataSource("metrics_loss"));
        PgFenceMetrics metrics = new PgFenceMetrics(client)) {
      metrics.bindTo(registry);
      KeptLease lease =
          client.hold(key, AcquireOptions.ttl(Duration.ofMillis(900)), KeepOptions.defaults());
      assertEquals(1, kept(registry));
      assertEquals(
          0, registry.get("pgfence.lease.losses").tag("reason", "revoked").counter().count());
      cluster.revoke(key);
      assertEquals(LossReason.REVOKED, lease.lost().get(30, TimeUnit.SECONDS));
      await(
          () ->
              registry.get("pgfence.lease.losses").tag("reason", "revoked").counter().count() == 1,
          "the loss counted as revoked");
      assertEquals(0, kept(registry), "a lost lease is kept no more");
      // The renewal that found it is told after the loss.
      await(
          () -> timer(registry, "pgfence.renew", "lost").count() == 1,
          "the renewal that found the loss timed as lost");
      lease.close();
      assertEquals(
          1, registry.get("pgfence.lease.losses").tag("reason", "revoked").counter().count());
      assertEquals(
          0, registry.get("pgfence.lease.losses").tag("reason", "expired").counter().count());
    }
  }

  @Test
  void leadershipIsOneWhileLeading() throws Exception {
    String election = key("election");
    SimpleMeterRegistry registry = new SimpleMeterRegistry();
    try (FenceClient client = new FenceClient(cluster.dataSource("metrics_elector"));
        PgFenceMetrics metrics = new PgFenceMetrics(client);
        Elector elector =
            new Elector(client, election, ElectorOptions.ttl(Duration.ofSeconds(5)))) {
      metrics.bindTo(registry);
      assertTrue(registry.find("pgfence.leadership").gauges().isEmpty(), "no election yet");
      Leadership leadership = elector.campaign("node-1");
      Gauge gauge = registry.get("pgfence.leadership").tag("election", election).gauge();
      assertEquals(1, gauge.value());
      assertEquals(1, kept(registry), "a leadership is a kept lease");
      assertTrue(leadership.resign());
      await(() -> gauge.value() == 0, "the gauge back to 0 after resigning");
      assertEquals(0, kept(registry));
      // A registry bound later sees the election too.
      SimpleMeterRegistry late = new SimpleMeterRegistry();
      metrics.bindTo(late);
      assertEquals(0, late.get("pgfence.leadership").tag("election", election).gauge().value());
    }
  }
}
