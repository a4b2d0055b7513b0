package io.pgfence;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import io.pgfence.testing.Cluster;
import io.pgfence.testing.JsonData;
import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.UUID;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.function.BooleanSupplier;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;

/**
 * The elector's behaviours, from clients/behaviours/elector.json, which the Python and Rust suites
 * run too: every scenario through the Java {@link Elector}, against a real server.
 */
class ElectorBehavioursTest {
  private static final double LIMIT = 10.0;
  private static Cluster cluster;

  @BeforeAll
  static void create() {
    cluster = new Cluster("elector", 27807).create();
  }

  @AfterAll
  static void destroy() {
    cluster.destroy();
  }

  @TestFactory
  Stream<DynamicTest> electorBehaviours() {
    return ScenarioTests.of(
        "elector.json",
        cluster,
        "elector_crash",
        27808,
        (own, scenario) -> new Run(own, scenario).run());
  }

  private static Duration seconds(Object value) {
    return Duration.ofNanos((long) (((Double) value) * 1e9));
  }

  private static void eventually(BooleanSupplier check, double limit, String what)
      throws InterruptedException {
    long end = System.nanoTime() + (long) (limit * 1e9);
    while (!check.getAsBoolean()) {
      if (System.nanoTime() > end) {
        fail(what);
      }
      Thread.sleep(5);
    }
  }

  /** A candidate: its own client and elector, campaigning on a thread of its own. */
  private static final class Candidate {
    final String app;
    final FenceClient client;
    final Elector elector;
    final List<Leadership> started = new CopyOnWriteArrayList<>();
    final List<String> stopped = new CopyOnWriteArrayList<>();
    volatile Leadership leadership;
    volatile Throwable error;
    Thread thread;

    Candidate(Cluster cluster, String app, String key, ElectorOptions options) {
      this.app = app;
      this.client = new FenceClient(cluster.dataSource(app));
      this.elector =
          new Elector(
              client,
              key,
              options
                  .onStartedLeading(started::add)
                  .onStoppedLeading(reason -> stopped.add(reason.wireName())));
    }

    void start(String value) {
      thread =
          new Thread(
              () -> {
                try {
                  leadership = elector.campaign(value);
                } catch (Throwable e) {
                  error = e;
                }
              });
      thread.start();
    }

    void close() throws InterruptedException {
      elector.close();
      thread.join(10_000);
      client.close();
    }
  }

  private static final class Run {
    final Cluster cluster;
    final Map<String, Object> scenario;
    final String key;
    final FenceClient client;
    final Elector watcher;
    final Map<String, Candidate> candidates = new HashMap<>();
    final Map<String, String> values = new HashMap<>();
    final Map<String, List<Optional<Leader>>> observers = new HashMap<>();
    final Map<String, Integer> read = new HashMap<>();
    final Map<String, Leader> handed = new HashMap<>();
    long stepEnded = System.nanoTime();

    Run(Cluster cluster, Map<String, Object> scenario) {
      this.cluster = cluster;
      this.scenario = scenario;
      this.key = "elector:" + scenario.get("name") + ":" + System.nanoTime();
      this.client = new FenceClient(cluster.dataSource("beh_watcher"));
      this.watcher = new Elector(client, key, ElectorOptions.ttl(Duration.ofSeconds(5)));
    }

    void run() throws Exception {
      int number = 0;
      try {
        for (Object item : JsonData.asList(scenario.get("steps"))) {
          Map<String, Object> step = JsonData.asMap(item);
          try {
            step(step);
          } catch (AssertionError e) {
            throw new AssertionError("step " + number + " " + step + ": " + e.getMessage(), e);
          }
          number++;
          stepEnded = System.nanoTime();
        }
      } finally {
        for (Candidate candidate : candidates.values()) {
          candidate.close();
        }
        watcher.close();
        client.close();
      }
    }

    Leader leaderOf(Object name) {
      if (name == null) {
        return null;
      }
      return new Leader(candidates.get(name).leadership.fence(), values.get(name), null, null);
    }

    Candidate candidate(Map<String, Object> step, String verb) {
      Candidate candidate = candidates.get((String) step.get(verb));
      assertNotNull(candidate, "no candidate " + step.get(verb));
      return candidate;
    }

    void step(Map<String, Object> step) throws Exception {
      String verb = step.keySet().iterator().next();
      switch (verb) {
        case "observe" -> observe((String) step.get(verb));
        case "campaign" -> campaign(step);
        case "leads" -> leads(step);
        case "waiters" -> {
          int want = ((Double) step.get(verb)).intValue();
          eventually(
              () -> Integer.parseInt(cluster.sql("SELECT fence.waiters(?)", key)) == want,
              LIMIT,
              "not " + want + " waiters");
        }
        case "waits" -> {
          Candidate candidate = candidate(step, verb);
          assertTrue(candidate.leadership == null && candidate.error == null, "it is not waiting");
        }
        case "observed" -> {
          String name = (String) step.get(verb);
          List<Optional<Leader>> seen = observers.get(name);
          int index = read.get(name);
          eventually(() -> seen.size() > index, LIMIT, "observed nothing new after " + seen);
          read.put(name, index + 1);
          assertEquals(
              Optional.ofNullable(leaderOf(step.get("leader"))),
              seen.get(index),
              "observed " + seen);
        }
        case "leader" ->
            assertEquals(Optional.ofNullable(leaderOf(step.get("leader"))), watcher.leader());
        case "proclaim" -> {
          candidate(step, verb).leadership.proclaim((String) step.get("value"));
          values.put((String) step.get(verb), (String) step.get("value"));
        }
        case "resign" -> {
          Leadership leadership = candidate(step, verb).leadership;
          String found = (String) step.getOrDefault("found", "released");
          boolean resigned = leadership.resign();
          Optional<String> reason = leadership.keptLease().reason().map(LossReason::wireName);
          assertEquals(found.equals("released"), resigned, "resign found " + reason);
          assertEquals(found.equals("released") ? Optional.empty() : Optional.of(found), reason);
        }
        case "stopped" -> {
          Candidate candidate = candidate(step, verb);
          eventually(() -> !candidate.stopped.isEmpty(), LIMIT, "on_stopped_leading not told");
          assertEquals(List.of(step.get("reason")), candidate.stopped);
        }
        case "handoff" -> {
          Optional<Leader> next = candidate(step, verb).leadership.handoff((String) step.get("to"));
          Object result = step.get("result");
          if (result == null) {
            assertEquals(Optional.empty(), next, "handed to " + next);
          } else {
            assertTrue(next.isPresent(), "handed to nobody");
            assertEquals(values.get(result), next.get().owner());
            handed.put((String) result, next.get());
          }
        }
        case "cancel" -> candidate(step, verb).elector.close();
        case "revoke" -> assertEquals("t", cluster.sql("SELECT fence.lease_revoke(?)", key));
        case "terminate" ->
            assertTrue(cluster.terminate(candidate(step, verb).app) > 0, "no session to end");
        case "freeze_server" -> {
          cluster.signal("STOP");
          try {
            Thread.sleep(seconds(step.get(verb)).toMillis());
          } finally {
            cluster.signal("CONT");
          }
        }
        case "crash_server" -> {
          cluster.crash();
          cluster.start();
        }
        default -> fail("unknown step " + verb);
      }
    }

    void observe(String name) {
      List<Optional<Leader>> seen = new CopyOnWriteArrayList<>();
      observers.put(name, seen);
      read.put(name, 0);
      Elector.Observer observer = watcher.observe();
      Thread thread =
          new Thread(
              () -> {
                try {
                  while (true) {
                    seen.add(observer.next());
                  }
                } catch (Exception ended) {
                  // The elector was closed.
                }
              });
      thread.setDaemon(true);
      thread.start();
    }

    void campaign(Map<String, Object> step) {
      String name = (String) step.get("campaign");
      String app = "beh_" + name + "_" + UUID.randomUUID().toString().substring(0, 8);
      AcquireOptions lease =
          AcquireOptions.ttl(seconds(step.getOrDefault("ttl", scenario.get("ttl"))))
              .durable((Boolean) step.getOrDefault("durable", true))
              .sessionBound((Boolean) step.getOrDefault("session_bound", false))
              .lockDelay(seconds(step.getOrDefault("lock_delay", 0.0)));
      Candidate candidate =
          new Candidate(cluster, app, key, ElectorOptions.ttl(lease.ttl()).lease(lease));
      candidates.put(name, candidate);
      values.put(name, (String) step.get("value"));
      candidate.start((String) step.get("value"));
    }

    void leads(Map<String, Object> step) throws InterruptedException {
      Candidate candidate = candidate(step, "leads");
      double limit = step.containsKey("within") ? (Double) step.get("within") : LIMIT;
      eventually(
          () -> candidate.leadership != null || candidate.error != null,
          limit,
          "not elected within " + limit + " s");
      assertNull(candidate.error, "the campaign failed: " + candidate.error);
      double took = (System.nanoTime() - stepEnded) / 1e9;
      if (step.containsKey("not_before")) {
        assertTrue(took >= (Double) step.get("not_before"), "elected after " + took + " s");
      }
      eventually(
          () -> candidate.started.equals(List.of(candidate.leadership)),
          5,
          "on_started_leading not told");
      if (step.containsKey("fence_above")) {
        assertTrue(
            candidate.leadership.fence()
                > candidates.get((String) step.get("fence_above")).leadership.fence());
      }
      String name = (String) step.get("leads");
      if (handed.containsKey(name)) {
        assertEquals(handed.get(name), leaderOf(name), "not the lease the hand-off gave");
      }
      assertFalse(candidate.leadership.stoppedReason().isPresent());
    }
  }
}
