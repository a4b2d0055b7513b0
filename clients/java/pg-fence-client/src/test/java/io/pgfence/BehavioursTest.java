package io.pgfence;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import io.pgfence.testing.Cluster;
import io.pgfence.testing.JsonData;
import io.pgfence.testing.Proxy;
import java.sql.Connection;
import java.sql.SQLException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;

/**
 * The kept lease's behaviours, from the language-neutral clients/behaviours/keeper.json: every
 * scenario, step by step, against a real server. Prints how long each loss took to be told.
 */
class BehavioursTest {
  private static Cluster cluster;

  @BeforeAll
  static void create() {
    cluster = new Cluster("behaviours", 27802).create();
  }

  @AfterAll
  static void destroy() {
    cluster.destroy();
  }

  @TestFactory
  Stream<DynamicTest> keeperBehaviours() {
    return ScenarioTests.of(
        "keeper.json",
        cluster,
        "behaviours_crash",
        27806,
        (own, scenario) -> new Run(own, scenario).run());
  }

  /** A holder: its own client, its kept lease, and what it was told. */
  private static final class Holder {
    final FenceClient client;
    final KeptLease lease;
    final List<LossReason> told;
    final Proxy proxy;

    Holder(FenceClient client, KeptLease lease, List<LossReason> told, Proxy proxy) {
      this.client = client;
      this.lease = lease;
      this.told = told;
      this.proxy = proxy;
    }
  }

  private static final class Run {
    final Cluster cluster;
    final Map<String, Object> scenario;
    final String key;
    final Map<String, Holder> holders = new HashMap<>();
    final List<Thread> resumes = new ArrayList<>();
    long previousStart;
    long stepStart;
    String previousVerb = "";
    String verb = "";

    Run(Cluster cluster, Map<String, Object> scenario) {
      this.cluster = cluster;
      this.scenario = scenario;
      this.key = scenario.get("name") + ":" + System.nanoTime();
    }

    void run() throws Exception {
      try {
        for (Object item : JsonData.asList(scenario.get("steps"))) {
          Map<String, Object> step = JsonData.asMap(item);
          previousStart = stepStart;
          previousVerb = verb;
          stepStart = System.nanoTime();
          verb = step.keySet().iterator().next();
          step(step);
        }
      } finally {
        for (Thread resume : resumes) {
          resume.join();
        }
        for (Holder holder : holders.values()) {
          holder.lease.close();
          holder.client.close();
          if (holder.proxy != null) {
            holder.proxy.close();
          }
        }
      }
    }

    Holder holder(Map<String, Object> step, String verb) {
      Holder holder = holders.get((String) step.get(verb));
      assertNotNull(holder, "no holder " + step.get(verb));
      return holder;
    }

    static Duration seconds(Object value) {
      return Duration.ofNanos((long) (((Double) value) * 1e9));
    }

    void step(Map<String, Object> step) throws Exception {
      String verb = step.keySet().iterator().next();
      switch (verb) {
        case "hold" -> hold(step);
        case "held" -> {
          Holder holder = holder(step, verb);
          long until = System.nanoTime() + seconds(step.get("for")).toNanos();
          while (System.nanoTime() < until) {
            assertTrue(holder.lease.isHeld(), "not held: " + holder.lease.state());
            Thread.sleep(20);
          }
          assertTrue(holder.told.isEmpty(), "told " + holder.told);
        }
        case "revoke" -> cluster.revoke(key);
        case "terminate" ->
            assertTrue(cluster.terminate("beh_" + step.get(verb)) > 0, "no session ended");
        case "stop_server_for" -> {
          cluster.signal("STOP");
          long resumeIn = seconds(step.get(verb)).toMillis();
          Thread resume =
              new Thread(
                  () -> {
                    try {
                      Thread.sleep(resumeIn);
                    } catch (InterruptedException ignored) {
                      // Resume at once.
                    }
                    cluster.signal("CONT");
                  });
          resume.start();
          resumes.add(resume);
        }
        case "hang_connections" -> holder(step, verb).proxy.hangExisting();
        case "crash_server" -> {
          cluster.crash();
          cluster.start();
        }
        case "take_over" -> takeOver(step);
        case "told" -> told(step);
        case "not_told" -> {
          Holder holder = holder(step, verb);
          assertTrue(holder.told.isEmpty(), "told " + holder.told);
          assertTrue(holder.lease.isHeld());
        }
        case "guard" -> assertEquals(step.get("result"), guard(holder(step, verb)));
        case "release" -> {
          Holder holder = holder(step, verb);
          assertEquals(step.get("result"), holder.lease.release());
          assertEquals(step.get("state"), holder.lease.state().name().toLowerCase(Locale.ROOT));
          if (step.containsKey("reason")) {
            assertEquals(step.get("reason"), holder.lease.reason().orElseThrow().wireName());
          }
        }
        default -> fail("unknown step " + verb);
      }
    }

    void hold(Map<String, Object> step) throws SQLException, java.io.IOException {
      String name = (String) step.get("hold");
      AcquireOptions opts =
          AcquireOptions.ttl(seconds(step.getOrDefault("ttl", scenario.get("ttl"))))
              .owner(name)
              .durable((Boolean) step.getOrDefault("durable", true))
              .sessionBound((Boolean) step.getOrDefault("session_bound", false));
      List<LossReason> told = new CopyOnWriteArrayList<>();
      KeepOptions keep = KeepOptions.defaults().onLost((lease, reason) -> told.add(reason));
      if (step.containsKey("renew_every")) {
        keep = keep.renewEvery(seconds(step.get("renew_every")));
      }
      Proxy proxy =
          (Boolean) step.getOrDefault("via_proxy", false) ? new Proxy(cluster.port()) : null;
      int port = proxy == null ? cluster.port() : proxy.port();
      FenceClient client = new FenceClient(Cluster.dataSource("beh_" + name, port));
      KeptLease lease = client.hold(key, opts, keep);
      holders.put(name, new Holder(client, lease, told, proxy));
      assertTrue(lease.isHeld());
    }

    void takeOver(Map<String, Object> step) throws SQLException {
      Holder holder = holder(step, "take_over");
      try (Connection conn = cluster.connect("beh_other")) {
        AcquireOptions opts =
            AcquireOptions.ttl(Duration.ofSeconds(30)).waitFor(seconds(step.get("wait")));
        Lease lease =
            PgFence.acquire(conn, key, opts).orElseThrow(() -> new AssertionError("not granted"));
        assertTrue(lease.fence() > holder.lease.fence());
      }
    }

    void told(Map<String, Object> step) throws Exception {
      Holder holder = holder(step, "told");
      double within = (Double) step.get("within");
      long limit = previousStart + (long) ((within + 5) * 1e9);
      while (holder.told.isEmpty() && System.nanoTime() < limit) {
        Thread.sleep(1);
      }
      assertEquals(1, holder.told.size(), "told " + holder.told);
      LossReason reason = holder.told.get(0);
      assertEquals(step.get("reason"), reason.wireName());
      assertEquals(reason, holder.lease.lost().get(1, TimeUnit.SECONDS), "the future agrees");
      assertEquals(step.get("state"), holder.lease.state().name().toLowerCase(Locale.ROOT));
      double took = (holder.lease.toldAtNanos() - previousStart) / 1e9;
      System.out.printf(
          "[behaviour] %s: told %s %.1f ms after the %s began (limit %.0f ms)%n",
          scenario.get("name"), reason, took * 1000, previousVerb, within * 1000);
      assertTrue(took <= within, "told after " + took + " s, more than " + within);
      assertFalse(holder.lease.isHeld());
    }

    String guard(Holder holder) throws SQLException {
      try (Connection conn = cluster.connect("beh_writer")) {
        conn.setAutoCommit(false);
        try {
          holder.lease.guard(conn);
          conn.commit();
          return "ok";
        } catch (StaleFenceException stale) {
          conn.rollback();
          return "stale";
        } catch (LeaseLostException lost) {
          assertNull(lost.getCause(), "refused by the holder, before anything was sent");
          conn.rollback();
          return "lost";
        }
      }
    }
  }
}
