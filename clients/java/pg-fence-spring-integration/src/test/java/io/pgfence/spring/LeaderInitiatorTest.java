package io.pgfence.spring;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pgfence.FenceClient;
import io.pgfence.KeepOptions;
import io.pgfence.testing.Cluster;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.function.BooleanSupplier;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.springframework.integration.leader.Candidate;
import org.springframework.integration.leader.Context;
import org.springframework.integration.support.leader.LockRegistryLeaderInitiator;

/**
 * Spring Integration's own {@link LockRegistryLeaderInitiator} electing a leader through the
 * registry: one of two candidates leads, a revoke of its lease deposes it (onRevoked) and the other
 * is elected with a higher fence; stopping the leader releases at once.
 */
class LeaderInitiatorTest {
  private static Cluster cluster;

  @BeforeAll
  static void create() {
    cluster = new Cluster("spring_leader", 27831).create();
  }

  @AfterAll
  static void destroy() {
    cluster.destroy();
  }

  /** A candidate that records its grants (with the fence it leads under) and revocations. */
  private static final class Recorder implements Candidate {
    final String id;
    final PgFenceLockRegistry registry;
    final List<Long> granted = new CopyOnWriteArrayList<>();
    final List<String> events = new CopyOnWriteArrayList<>();
    final List<Long> at = new CopyOnWriteArrayList<>();

    Recorder(String id, PgFenceLockRegistry registry) {
      this.id = id;
      this.registry = registry;
    }

    @Override
    public String getRole() {
      return "leader";
    }

    @Override
    public String getId() {
      return id;
    }

    @Override
    public void onGranted(Context context) {
      granted.add(registry.obtain("leader").fence().orElseThrow());
      events.add("granted");
      at.add(System.nanoTime());
    }

    @Override
    public void onRevoked(Context context) {
      events.add("revoked");
      at.add(System.nanoTime());
    }

    boolean leads() {
      return !events.isEmpty() && events.get(events.size() - 1).equals("granted");
    }
  }

  private static void eventually(BooleanSupplier check, String what) throws InterruptedException {
    long end = System.nanoTime() + Duration.ofSeconds(15).toNanos();
    while (!check.getAsBoolean()) {
      assertTrue(System.nanoTime() < end, what);
      Thread.sleep(10);
    }
  }

  @Test
  void oneLeaderARevokeHandsOverAndAStopReleases() throws Exception {
    try (FenceClient clientA = new FenceClient(cluster.dataSource("leader_a"));
        FenceClient clientB = new FenceClient(cluster.dataSource("leader_b"))) {
      Duration ttl = Duration.ofSeconds(3);
      Recorder a =
          new Recorder(
              "a", new PgFenceLockRegistry(clientA, "spring:", ttl, KeepOptions.defaults()));
      Recorder b =
          new Recorder(
              "b", new PgFenceLockRegistry(clientB, "spring:", ttl, KeepOptions.defaults()));
      LockRegistryLeaderInitiator initiatorA = new LockRegistryLeaderInitiator(a.registry, a);
      LockRegistryLeaderInitiator initiatorB = new LockRegistryLeaderInitiator(b.registry, b);
      initiatorA.start();
      eventually(a::leads, "a was not elected");
      initiatorB.start();
      Thread.sleep(1000);
      assertTrue(a.leads() && b.events.isEmpty(), "one leader: " + a.events + " " + b.events);

      long revoked = System.nanoTime();
      cluster.revoke("spring:leader");
      eventually(() -> !a.leads(), "a was not deposed");
      eventually(b::leads, "b was not elected");
      System.out.printf(
          "[spring] revoke: the next leader's onGranted %.0f ms later, the deposed one's onRevoked"
              + " %.0f ms later (ttl 3 s: renewals every 1 s; heartbeat 500 ms)%n",
          (b.at.get(0) - revoked) / 1e6, (a.at.get(1) - revoked) / 1e6);
      assertTrue(b.granted.get(0) > a.granted.get(0), "a higher fence");

      long stopped = System.nanoTime();
      initiatorB.stop();
      eventually(a::leads, "a was not elected again");
      System.out.printf(
          "[spring] leader stopped: the next one's onGranted %.0f ms later%n",
          (a.at.get(2) - stopped) / 1e6);
      assertEquals("revoked", b.events.get(b.events.size() - 1));
      assertTrue(a.granted.get(1) > b.granted.get(0));
      initiatorA.stop();
      eventually(() -> !a.leads(), "a did not step down");
      initiatorA.destroy();
      initiatorB.destroy();
    }
  }
}
