package io.pgfence;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import com.zaxxer.hikari.HikariConfig;
import com.zaxxer.hikari.HikariDataSource;
import io.pgfence.testing.Cluster;
import io.pgfence.testing.JsonData;
import io.pgfence.testing.Percentiles;
import io.pgfence.testing.Proxy;
import io.pgfence.testing.Scenarios;
import java.sql.Connection;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.stream.Stream;
import javax.sql.DataSource;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;

/**
 * Keeping leases at scale, from the language-neutral clients/behaviours/keeping.json: every
 * scenario, step by step, against a real server. Prints the connections and renewal latencies of
 * 200 kept leases, and how long an observer took to say it cannot see.
 */
class KeepingBehavioursTest {
  private static Cluster cluster;

  @BeforeAll
  static void create() {
    cluster = new Cluster("keeping", 27810).create();
  }

  @AfterAll
  static void destroy() {
    cluster.destroy();
  }

  @TestFactory
  Stream<DynamicTest> keepingBehaviours() {
    return ScenarioTests.of(
        "keeping.json",
        cluster,
        "keeping_crash",
        27811,
        (own, scenario) -> new Run(own, scenario).run());
  }

  /**
   * The hogged-pool scenario through a client made with only the pool ({@code new
   * FenceClient(pool)}, no keeper DataSource): the keeper takes its connections from the pool
   * before the grant and holds them, so a pool hogged then loses nothing. The pool has room for
   * them: the scenario's size plus the keeper's {@link FenceClient#KEEPER_CONNECTIONS}.
   */
  @TestFactory
  Stream<DynamicTest> aHoggedPoolWithoutAKeeperDataSource() {
    return Scenarios.of("keeping.json").stream()
        .filter(
            scenario -> "a_pool_exhausted_at_the_grant_loses_nothing".equals(scenario.get("name")))
        .map(
            scenario ->
                DynamicTest.dynamicTest(
                    scenario.get("name") + " (pool only)",
                    () -> {
                      Run run = new Run(cluster, scenario);
                      run.poolOnly = true;
                      run.run();
                    }));
  }

  /** A client of its own: its pool (if any), its proxy (if any), its kept leases. */
  private static final class Client {
    final String name;
    final FenceClient client;
    final HikariDataSource pool;
    final Proxy proxy;
    final List<KeptLease> leases = new ArrayList<>();
    final List<LossReason> told = new CopyOnWriteArrayList<>();
    final List<Connection> hogged = new ArrayList<>();
    CompletableFuture<KeptLease> pending;
    Elector elector;
    Leadership leadership;
    Elector.Observer observer;
    final LinkedBlockingQueue<Object> seen = new LinkedBlockingQueue<>();
    long blindAtNanos;

    Client(String name, FenceClient client, HikariDataSource pool, Proxy proxy) {
      this.name = name;
      this.client = client;
      this.pool = pool;
      this.proxy = proxy;
    }

    KeepOptions keep() {
      return KeepOptions.defaults().onLost((lease, reason) -> told.add(reason));
    }

    void close() throws Exception {
      if (observer != null) {
        observer.close();
      }
      if (elector != null) {
        elector.close();
      }
      if (pending != null) {
        pending.cancel(true);
      }
      for (KeptLease lease : leases) {
        lease.close();
      }
      for (Connection conn : hogged) {
        conn.close();
      }
      client.close();
      if (pool != null) {
        pool.close();
      }
      if (proxy != null) {
        proxy.close();
      }
    }
  }

  private static final class Run {
    final Cluster cluster;
    final Map<String, Object> scenario;
    final String key;
    final Map<String, Client> clients = new HashMap<>();
    boolean poolOnly; // a client with a pool has no keeper DataSource: its keeper uses the pool
    long previousStart;
    long stepStart;

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
          stepStart = System.nanoTime();
          step(step);
        }
      } finally {
        for (Client client : clients.values()) {
          client.close();
        }
      }
    }

    static Duration seconds(Object value) {
      return Duration.ofNanos((long) (((Number) value).doubleValue() * 1e9));
    }

    Client client(String name, Integer pool, int keeperConnections, boolean proxied)
        throws Exception {
      return client(name, pool, keeperConnections, proxied, null);
    }

    /**
     * The client {@code name}, made on first use: a HikariCP pool of {@code pool} connections (or
     * plain connections), through a proxy when asked, with a keeper of its own connections, its
     * retries taking {@code retryFor} at most (null: the default backoff's).
     */
    Client client(
        String name, Integer pool, int keeperConnections, boolean proxied, Duration retryFor)
        throws Exception {
      Client existing = clients.get(name);
      if (existing != null) {
        return existing;
      }
      Proxy proxy = proxied ? new Proxy(cluster.port()) : null;
      int port = proxy == null ? cluster.port() : proxy.port();
      DataSource calls = Cluster.dataSource("beh_" + name, port);
      HikariDataSource hikari = null;
      if (pool != null) {
        HikariConfig config = new HikariConfig();
        config.setDataSource(calls);
        int size = poolOnly ? pool + keeperConnections : pool;
        config.setMaximumPoolSize(size);
        config.setMinimumIdle(size);
        config.setConnectionTimeout(250);
        hikari = new HikariDataSource(config);
        calls = hikari;
      }
      DataSource keeper =
          poolOnly && hikari != null ? hikari : Cluster.dataSource("beh_" + name + "_keeper", port);
      Backoff backoff = Backoff.defaults();
      if (retryFor != null) {
        backoff = new Backoff(backoff.base(), backoff.cap(), backoff.maxAttempts(), retryFor);
      }
      Client client =
          new Client(
              name,
              new FenceClient(calls, keeper, keeperConnections, backoff, Duration.ofSeconds(30)),
              hikari,
              proxy);
      clients.put(name, client);
      return client;
    }

    Client named(Map<String, Object> step, String verb) {
      Client client = clients.get((String) step.get(verb));
      assertNotNull(client, "no client " + step.get(verb));
      return client;
    }

    AcquireOptions ttl(Map<String, Object> step, String name) {
      return AcquireOptions.ttl(seconds(step.get("ttl"))).owner(name);
    }

    void step(Map<String, Object> step) throws Exception {
      String verb = step.keySet().iterator().next();
      switch (verb) {
        case "hold_many" -> holdMany(step);
        case "all_held" -> allHeld(step);
        case "connections" -> connections(step);
        case "hold" -> {
          String name = (String) step.get(verb);
          Integer pool = step.containsKey("pool") ? ((Number) step.get("pool")).intValue() : null;
          Client client = client(name, pool, FenceClient.KEEPER_CONNECTIONS, false);
          KeptLease lease = client.client.hold(key, ttl(step, name), client.keep());
          client.leases.add(lease);
          assertTrue(lease.isHeld());
        }
        case "hog_pool" -> {
          Client client = named(step, verb);
          // Every connection the pool can give (those its client's keeper holds are not free).
          while (client.hogged.size() < client.pool.getMaximumPoolSize()) {
            try {
              client.hogged.add(client.pool.getConnection());
            } catch (java.sql.SQLTransientConnectionException exhausted) {
              break;
            }
          }
          assertEquals(0, client.pool.getHikariPoolMXBean().getIdleConnections());
        }
        case "release_pool" -> {
          Client client = named(step, verb);
          for (Connection conn : client.hogged) {
            conn.close();
          }
          client.hogged.clear();
        }
        case "held" -> {
          Client client = named(step, verb);
          KeptLease lease = client.leases.get(0);
          long until = System.nanoTime() + seconds(step.get("for")).toNanos();
          while (System.nanoTime() < until) {
            assertTrue(lease.isHeld(), "not held: " + lease.state() + " " + lease.reason());
            Thread.sleep(20);
          }
          assertTrue(client.told.isEmpty(), "told " + client.told);
        }
        case "acquire_waiting" -> {
          String name = (String) step.get(verb);
          Duration retryFor = step.containsKey("retry_for") ? seconds(step.get("retry_for")) : null;
          Client client = client(name, null, FenceClient.KEEPER_CONNECTIONS, true, retryFor);
          AcquireOptions opts = ttl(step, name).waitFor(seconds(step.get("wait")));
          client.pending = client.client.holdAsync(key, opts, client.keep());
        }
        case "waiters" -> {
          int want = ((Number) step.get(verb)).intValue();
          long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
          while (Integer.parseInt(cluster.sql("SELECT fence.waiters(?)", key)) != want) {
            assertTrue(System.nanoTime() < until, "waiters never " + want);
            Thread.sleep(10);
          }
        }
        case "hang_connections" -> named(step, verb).proxy.hangExisting();
        case "release_other" -> {
          Client other = clients.get((String) step.get("by"));
          assertTrue(other.leases.get(0).release(), "the other holder released the key");
          other.leases.clear();
          // The waiting acquire is granted on the server; its reply is stuck in the proxy.
          long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
          while (!"b"
              .equals(cluster.sql("SELECT owner FROM fence.leases WHERE key = ? AND live", key))) {
            assertTrue(System.nanoTime() < until, "the waiting acquire was never granted");
            Thread.sleep(5);
          }
        }
        case "give_up" -> {
          Client client = named(step, verb);
          assertTrue(client.pending.cancel(true), "the call had already ended");
          try {
            client.pending.join();
            fail("a call given up granted something");
          } catch (CancellationException expected) {
            // What a caller that gave up gets.
          }
        }
        case "key_free" -> {
          long limit = previousStart + seconds(step.get("within")).toNanos();
          while (Integer.parseInt(
                  cluster.sql("SELECT count(*) FROM fence.leases WHERE key = ? AND live", key))
              > 0) {
            assertTrue(System.nanoTime() < limit, "the given-up grant still holds the key");
            Thread.sleep(10);
          }
          System.out.printf(
              "[behaviour] %s: the key was free %.1f ms after the call was given up%n",
              scenario.get("name"), (System.nanoTime() - previousStart) / 1e6);
        }
        case "release" -> {
          Client client = named(step, verb);
          assertEquals(step.get("result"), client.leases.get(0).release());
          client.leases.remove(0);
        }
        case "pause" -> Thread.sleep(seconds(step.get(verb)).toMillis());
        case "terminate" -> {
          String app = "beh_" + named(step, verb).name;
          int ended =
              Integer.parseInt(
                  cluster.sql(
                      "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                          + " WHERE application_name IN (?, ?)",
                      app,
                      app + "_keeper"));
          assertTrue(ended > 0, "no session of " + app + " to end");
        }
        case "granted" -> {
          Client client = named(step, verb);
          assertNotNull(client.pending, "no acquire running");
          KeptLease lease;
          try {
            lease = client.pending.get(seconds(step.get("within")).toNanos(), TimeUnit.NANOSECONDS);
          } catch (TimeoutException e) {
            throw new AssertionError("no answer within " + seconds(step.get("within")), e);
          } catch (ExecutionException e) {
            throw new AssertionError("the acquire failed: " + e.getCause(), e.getCause());
          }
          client.pending = null;
          client.leases.add(lease);
          assertTrue(lease.isHeld(), "not held: " + lease.state() + " " + lease.reason());
        }
        case "hold_first_free" -> holdFirstFree(step);
        case "hold_other" -> {
          try (Connection conn = cluster.connect("beh_other")) {
            String other = key + "-" + ((Number) step.get("index")).intValue();
            assertTrue(
                PgFence.acquire(conn, other, AcquireOptions.ttl(Duration.ofHours(1))).isPresent());
          }
        }
        case "lead" -> {
          String name = (String) step.get(verb);
          Client client = client(name, null, FenceClient.KEEPER_CONNECTIONS, false);
          client.elector =
              new Elector(client.client, key, ElectorOptions.ttl(seconds(step.get("ttl"))));
          client.leadership = client.elector.campaign(name);
        }
        case "observe" -> observe(step);
        case "observed" -> {
          Client client = named(step, verb);
          Object next = client.seen.poll(10, TimeUnit.SECONDS);
          assertNotNull(next, "told nothing");
          Object leader = step.get("leader");
          assertEquals(leader == null ? Optional.empty() : Optional.of(leader), next);
        }
        case "blind" -> {
          Client client = named(step, verb);
          long limit = previousStart + seconds(step.get("within")).toNanos();
          Object next =
              client.seen.poll(
                  Math.max(0, limit - System.nanoTime()) + TimeUnit.SECONDS.toNanos(5),
                  TimeUnit.NANOSECONDS);
          assertTrue(next instanceof ObserverBlindException, "told " + next + ", not blindness");
          double took = (client.blindAtNanos - previousStart) / 1e9;
          System.out.printf(
              "[behaviour] %s: the observer said it cannot see %.1f ms after the hang (limit %.0f"
                  + " ms)%n",
              scenario.get("name"), took * 1000, seconds(step.get("within")).toMillis() * 1.0);
          assertTrue(took <= seconds(step.get("within")).toNanos() / 1e9, "took " + took + " s");
        }
        default -> fail("unknown step " + verb);
      }
    }

    void holdMany(Map<String, Object> step) throws Exception {
      String name = (String) step.get("hold_many");
      int count = ((Number) step.get("count")).intValue();
      int connections = ((Number) step.get("keeper_connections")).intValue();
      Client client = client(name, null, connections, false);
      AcquireOptions opts = ttl(step, name);
      for (int i = 0; i < count; i++) {
        client.leases.add(client.client.hold(key + "-" + i, opts, client.keep()));
      }
      for (KeptLease lease : client.leases) {
        assertTrue(lease.isHeld(), lease.key() + " " + lease.state());
      }
    }

    void allHeld(Map<String, Object> step) throws Exception {
      Client client = named(step, "all_held");
      long started = System.nanoTime();
      long until = started + seconds(step.get("for")).toNanos();
      while (System.nanoTime() < until) {
        for (KeptLease lease : client.leases) {
          assertTrue(lease.isHeld(), lease.key() + " " + lease.state() + " " + lease.reason());
        }
        Thread.sleep(20);
      }
      assertTrue(client.told.isEmpty(), "told " + client.told);
      Keeper.Stats stats = client.client.keeperStats();
      System.out.printf(
          "[behaviour] %s: %d leases kept over %d connections, renewals p50 %.2f ms, p99 %.2f ms"
              + " (%d lease_renew_many calls)%n",
          scenario.get("name"),
          client.leases.size(),
          stats.connectionsMade(),
          Percentiles.millis(stats.latencyNanos(), 50),
          Percentiles.millis(stats.latencyNanos(), 99),
          stats.latencyNanos().length);
    }

    void connections(Map<String, Object> step) {
      Client client = named(step, "connections");
      int atMost = ((Number) step.get("at_most")).intValue();
      String name = (String) step.get("connections");
      int open =
          Integer.parseInt(
              cluster.sql(
                  "SELECT count(*) FROM pg_stat_activity WHERE application_name = ?",
                  "beh_" + name + "_keeper"));
      Keeper.Stats stats = client.client.keeperStats();
      assertTrue(open <= atMost, open + " keeper connections");
      // Made no more than it has: none made again since it started.
      assertTrue(stats.connectionsMade() <= atMost, stats.connectionsMade() + " made");
      assertEquals(open, stats.connectionsOpen());
    }

    void holdFirstFree(Map<String, Object> step) throws Exception {
      String name = (String) step.get("hold_first_free");
      int count = ((Number) step.get("count")).intValue();
      Client client = client(name, null, FenceClient.KEEPER_CONNECTIONS, false);
      List<String> keys = new ArrayList<>();
      for (int i = 0; i < count; i++) {
        keys.add(key + "-" + i);
      }
      Optional<KeptLease> kept = client.client.holdFirstFree(keys, ttl(step, name), client.keep());
      Object got = step.get("got");
      if (got == null) {
        assertFalse(kept.isPresent(), "got " + kept);
        assertEquals(
            "0",
            cluster.sql(
                "SELECT count(*) FROM fence.leases WHERE owner = ? AND key LIKE ? AND live",
                name,
                key + "-%"));
      } else {
        assertTrue(kept.isPresent(), "none was free");
        assertEquals(key + "-" + ((Number) got).intValue(), kept.get().key());
        client.leases.add(kept.get());
      }
    }

    void observe(Map<String, Object> step) throws Exception {
      String name = (String) step.get("observe");
      Client client = client(name, null, FenceClient.KEEPER_CONNECTIONS, true);
      client.elector =
          new Elector(client.client, key, ElectorOptions.ttl(seconds(step.get("ttl"))));
      client.observer = client.elector.observe();
      Thread thread =
          new Thread(
              () -> {
                while (true) {
                  try {
                    Optional<Leader> leader = client.observer.next();
                    client.seen.add(leader.map(Leader::owner));
                  } catch (ObserverBlindException blind) {
                    client.blindAtNanos = System.nanoTime();
                    client.seen.add(blind);
                  } catch (java.sql.SQLException e) {
                    return;
                  }
                }
              },
              "observer " + name);
      thread.setDaemon(true);
      thread.start();
    }
  }
}
