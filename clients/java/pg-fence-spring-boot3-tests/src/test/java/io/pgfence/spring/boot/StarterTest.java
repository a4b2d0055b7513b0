package io.pgfence.spring.boot;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.micrometer.core.instrument.MeterRegistry;
import io.pgfence.AcquireOptions;
import io.pgfence.FenceClient;
import io.pgfence.KeepOptions;
import io.pgfence.KeptLease;
import io.pgfence.Lease;
import io.pgfence.PgFence;
import io.pgfence.micrometer.PgFenceMetrics;
import io.pgfence.shedlock.PgFenceLock;
import io.pgfence.shedlock.PgFenceLockProvider;
import io.pgfence.spring.jdbc.ConnectionGuard;
import io.pgfence.spring.jdbc.FenceSqlExceptionTranslator;
import io.pgfence.spring.jdbc.FencedTransactions;
import io.pgfence.spring.jdbc.LeaseLostDataAccessException;
import io.pgfence.spring.jdbc.StaleFenceDataAccessException;
import io.pgfence.spring.support.FencedLockRegistrySupport;
import io.pgfence.spring.support.FencedLockSupport;
import io.pgfence.testing.Cluster;
import java.sql.SQLException;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicBoolean;
import javax.sql.DataSource;
import net.javacrumbs.shedlock.core.LockConfiguration;
import net.javacrumbs.shedlock.core.LockProvider;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.springframework.boot.SpringBootConfiguration;
import org.springframework.boot.autoconfigure.EnableAutoConfiguration;
import org.springframework.boot.builder.SpringApplicationBuilder;
import org.springframework.context.ApplicationContextInitializer;
import org.springframework.context.ConfigurableApplicationContext;
import org.springframework.context.annotation.Bean;
import org.springframework.integration.support.leader.LockRegistryLeaderInitiator;
import org.springframework.integration.support.locks.LockRegistry;
import org.springframework.jdbc.UncategorizedSQLException;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.jdbc.support.SQLExceptionTranslator;
import org.springframework.jdbc.support.SQLStateSQLExceptionTranslator;
import org.springframework.transaction.PlatformTransactionManager;
import org.springframework.transaction.support.TransactionTemplate;

/**
 * The starter in a Boot application started here (Boot 3.5 with Spring Integration 6 in
 * pg-fence-spring-boot3-tests, Boot 4.0 with Spring Integration 7 in pg-fence-spring-boot4-tests,
 * from the same sources), against a scratch cluster: the auto-configured beans, the application's
 * own beans making them back off, the properties, the typed exceptions through Boot's JdbcTemplate
 * and the fenced transactions.
 */
class StarterTest {
  private static final String BOOT = System.getProperty("pgfence.test.boot", "3");
  private static Cluster cluster;

  @BeforeAll
  static void create() {
    int port = Integer.parseInt(System.getProperty("pgfence.test.port", "27832"));
    cluster = new Cluster("boot" + BOOT, port).create();
    cluster.sql("CREATE TABLE jobs (id int PRIMARY KEY, v text)");
    cluster.sql("INSERT INTO jobs VALUES (1, 'first')");
  }

  @AfterAll
  static void destroy() {
    cluster.destroy();
  }

  /**
   * The README's two beans, less the registry the starter makes: Spring Integration's leader
   * initiator on the auto-configured registry.
   */
  @SpringBootConfiguration
  @EnableAutoConfiguration
  static class App {
    // LockRegistry is generic in Spring Integration 7 and raw in 6: these sources compile on both.
    @Bean
    @SuppressWarnings({"rawtypes", "unchecked"})
    LockRegistryLeaderInitiator leaderInitiator(LockRegistry registry) {
      return new LockRegistryLeaderInitiator(registry);
    }
  }

  private static ConfigurableApplicationContext start(
      ApplicationContextInitializer<?> initializer, String... properties) {
    List<String> all = new ArrayList<>();
    all.add("spring.datasource.url=" + cluster.url());
    all.add("spring.datasource.username=postgres");
    all.add("spring.main.banner-mode=off");
    all.add("logging.level.root=warn");
    // The leader initiator's acquire in flight when the pool closes at shutdown.
    all.add("logging.level.com.zaxxer.hikari.pool.ProxyConnection=error");
    all.addAll(List.of(properties));
    SpringApplicationBuilder builder =
        new SpringApplicationBuilder(App.class).properties(all.toArray(new String[0]));
    if (initializer != null) {
      builder.initializers(initializer);
    }
    return builder.run();
  }

  private static void await(String what, java.util.function.BooleanSupplier condition)
      throws InterruptedException {
    long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
    while (!condition.getAsBoolean()) {
      assertTrue(System.nanoTime() < deadline, "not within 60 s: " + what);
      Thread.sleep(20);
    }
  }

  /** A lease of {@code key} for 30 s. */
  private static Lease acquire(FenceClient client, String key) throws SQLException {
    return client.acquire(key, AcquireOptions.ttl(Duration.ofSeconds(30))).orElseThrow();
  }

  /** A lease of {@code key} that was revoked: its fence is stale from now on. */
  private static Lease revoked(FenceClient client, String key) throws SQLException {
    Lease lease = acquire(client, key);
    cluster.revoke(key);
    return lease;
  }

  /** The guarded UPDATE of row 1 under {@code fence}: how many rows it updated. */
  private static int guardedUpdate(JdbcTemplate jdbc, String v, String key, long fence) {
    return jdbc.update("UPDATE jobs SET v = ? WHERE id = 1 AND " + PgFence.GUARD, v, key, fence);
  }

  @Test
  void autoConfiguredBeansOfTheRightLine() throws Exception {
    try (ConfigurableApplicationContext context = start(null)) {
      assertEquals(1, context.getBeansOfType(FenceClient.class).size());
      assertInstanceOf(PgFenceLockProvider.class, context.getBean(LockProvider.class));
      FencedLockRegistrySupport<?> registry = context.getBean(FencedLockRegistrySupport.class);
      String line =
          BOOT.equals("3")
              ? "io.pgfence.spring6.PgFenceLockRegistry"
              : "io.pgfence.spring.PgFenceLockRegistry";
      assertEquals(line, registry.getClass().getName());
      assertInstanceOf(
          FenceSqlExceptionTranslator.class,
          context.getBean(JdbcTemplate.class).getExceptionTranslator());
      assertEquals(1, context.getBeansOfType(FencedTransactions.class).size());
      LockRegistryLeaderInitiator initiator = context.getBean(LockRegistryLeaderInitiator.class);
      await("the leader initiator leads", () -> initiator.getContext().isLeader());
      assertTrue(registry.obtain("leader").fence().isPresent(), "the leader's lock has a fence");
    }
  }

  @Test
  void theClientsMetersAreInTheApplicationsRegistry() throws Exception {
    try (ConfigurableApplicationContext context = start(null)) {
      assertEquals(1, context.getBeansOfType(PgFenceMetrics.class).size());
      MeterRegistry registry = context.getBean(MeterRegistry.class);
      FenceClient client = context.getBean(FenceClient.class);
      // The leader initiator's lock is kept by the same client.
      LockRegistryLeaderInitiator initiator = context.getBean(LockRegistryLeaderInitiator.class);
      await("the leader initiator leads", () -> initiator.getContext().isLeader());
      double before = registry.get("pgfence.leases.kept").gauge().value();
      KeptLease kept =
          client
              .tryHold(
                  "metered", AcquireOptions.ttl(Duration.ofSeconds(30)), KeepOptions.defaults())
              .orElseThrow();
      try {
        assertEquals(before + 1, registry.get("pgfence.leases.kept").gauge().value());
        assertTrue(
            registry.get("pgfence.acquire").tag("outcome", "granted").timer().count() >= 2,
            "the leader's acquire and the kept lease's are timed");
      } finally {
        kept.release();
      }
      assertEquals(before, registry.get("pgfence.leases.kept").gauge().value());
    }
  }

  @Test
  void shedlockKeepAliveRenewsALockPastItsLockAtMostFor() throws Exception {
    try (ConfigurableApplicationContext context = start(null, "pgfence.shedlock.keep-alive=true")) {
      LockProvider provider = context.getBean(LockProvider.class);
      LockConfiguration config =
          new LockConfiguration(Instant.now(), "kept", Duration.ofSeconds(2), Duration.ZERO);
      PgFenceLock lock = (PgFenceLock) provider.lock(config).orElseThrow();
      try {
        // Past lockAtMostFor and its lease's expiry, unless renewed.
        Thread.sleep(3_500);
        assertTrue(lock.isHeld(), "held past lockAtMostFor: " + lock.reason());
        assertEquals("t", cluster.sql("SELECT live FROM fence.leases WHERE key = 'shedlock:kept'"));
      } finally {
        lock.unlock();
      }
      assertEquals("f", cluster.sql("SELECT live FROM fence.leases WHERE key = 'shedlock:kept'"));
    }
  }

  @Test
  void applicationBeansMakeTheAutoConfiguredOnesBackOff() throws Exception {
    FenceClient mine = new FenceClient(cluster.dataSource("mine"));
    PgFenceLockProvider myProvider = new PgFenceLockProvider(mine, "mine:");
    SQLExceptionTranslator myTranslator = new SQLStateSQLExceptionTranslator();
    try (ConfigurableApplicationContext probe = start(null)) {
      // The registry of this line, made as an application would, under its own prefix.
      Object myRegistry =
          probe
              .getBean(FencedLockRegistrySupport.class)
              .getClass()
              .getConstructor(FenceClient.class, String.class, Duration.class, KeepOptions.class)
              .newInstance(mine, "mine:", Duration.ofSeconds(30), KeepOptions.defaults());
      ApplicationContextInitializer<ConfigurableApplicationContext> own =
          context -> {
            context.getBeanFactory().registerSingleton("myClient", mine);
            context.getBeanFactory().registerSingleton("myProvider", myProvider);
            context.getBeanFactory().registerSingleton("myRegistry", myRegistry);
            context.getBeanFactory().registerSingleton("myTranslator", myTranslator);
          };
      try (ConfigurableApplicationContext context = start(own)) {
        assertSame(mine, context.getBean(FenceClient.class));
        assertSame(myProvider, context.getBean(LockProvider.class));
        assertSame(myRegistry, context.getBean(FencedLockRegistrySupport.class));
        assertEquals(1, context.getBeansOfType(LockRegistry.class).size());
        assertSame(myTranslator, context.getBean(SQLExceptionTranslator.class));
        // The application's translator is kept behind the typed translation.
        FenceSqlExceptionTranslator front =
            assertInstanceOf(
                FenceSqlExceptionTranslator.class,
                context.getBean(JdbcTemplate.class).getExceptionTranslator());
        assertSame(myTranslator, front.getFallbackTranslator());
      }
    } finally {
      mine.close();
    }
  }

  @Test
  void propertiesAreHonoured() throws Exception {
    try (ConfigurableApplicationContext context =
        start(
            null,
            "pgfence.registry.prefix=props:",
            "pgfence.registry.ttl=7s",
            "pgfence.owner=props-owner",
            "pgfence.keep.renew-every=2s",
            "pgfence.shedlock.prefix=jobs:",
            "pgfence.call-timeout=12s")) {
      PgFenceProperties properties = context.getBean(PgFenceProperties.class);
      assertEquals(Duration.ofSeconds(2), properties.getKeep().getRenewEvery());
      assertEquals(Duration.ofSeconds(12), properties.getCallTimeout());
      assertEquals("jobs:nightly", context.getBean(PgFenceLockProvider.class).key("nightly"));
      FencedLockRegistrySupport<?> registry = context.getBean(FencedLockRegistrySupport.class);
      assertEquals("props:", registry.prefix());
      assertEquals(Duration.ofSeconds(7), registry.ttl());
      FencedLockSupport lock = registry.obtain("k");
      assertTrue(lock.tryLock());
      try {
        assertEquals(
            "props-owner", cluster.sql("SELECT owner FROM fence.leases WHERE key = 'props:k'"));
        String ttl =
            cluster.sql(
                "SELECT extract(epoch FROM expires_at - acquired_at)::int FROM fence.leases"
                    + " WHERE key = 'props:k'");
        assertTrue(Integer.parseInt(ttl) <= 7, "a 7 s TTL, not " + ttl);
      } finally {
        lock.unlock();
      }
    }
  }

  @Test
  void staleFenceThroughJdbcTemplateIsTyped() throws Exception {
    try (ConfigurableApplicationContext context = start(null)) {
      FenceClient client = context.getBean(FenceClient.class);
      JdbcTemplate jdbc = context.getBean(JdbcTemplate.class);
      Lease first = revoked(client, "stale");
      Lease second = acquire(client, "stale");
      StaleFenceDataAccessException stale =
          assertThrows(
              StaleFenceDataAccessException.class,
              () -> guardedUpdate(jdbc, "stale", "stale", first.fence()));
      assertEquals("stale", stale.key());
      assertEquals(first.fence(), stale.fence());
      assertSame(stale.getCause(), stale.staleFence());
      assertEquals("first", cluster.sql("SELECT v FROM jobs WHERE id = 1"));
      LeaseLostDataAccessException lost =
          assertThrows(
              LeaseLostDataAccessException.class,
              () ->
                  jdbc.queryForList(
                      "SELECT fence.lease_renew(?, ?, interval '10 seconds')",
                      "stale",
                      first.token()));
      assertEquals("PF001", lost.leaseLost().getSQLState());
      assertEquals(1, guardedUpdate(jdbc, "second", "stale", second.fence()));
      client.release(second);
    }
  }

  @Test
  void withoutTheTranslationAStaleFenceIsUncategorized() throws Exception {
    try (ConfigurableApplicationContext context =
        start(null, "pgfence.jdbc.translate-exceptions=false")) {
      FenceClient client = context.getBean(FenceClient.class);
      JdbcTemplate jdbc = context.getBean(JdbcTemplate.class);
      Lease first = revoked(client, "untyped");
      UncategorizedSQLException untyped =
          assertThrows(
              UncategorizedSQLException.class,
              () -> guardedUpdate(jdbc, "stale", "untyped", first.fence()));
      assertEquals("PF002", untyped.getSQLException().getSQLState());
    }
  }

  @Test
  void fencedTransactionCommitsALiveHolderAndRefusesAStaleOne() throws Exception {
    try (ConfigurableApplicationContext context = start(null)) {
      FenceClient client = context.getBean(FenceClient.class);
      JdbcTemplate jdbc = context.getBean(JdbcTemplate.class);
      FencedTransactions fenced = context.getBean(FencedTransactions.class);
      try (KeptLease kept =
          client.hold("tx", AcquireOptions.ttl(Duration.ofSeconds(30)), KeepOptions.defaults())) {
        fenced.executeWithoutResult(
            kept::guard, status -> jdbc.update("INSERT INTO jobs VALUES (10, 'live')"));
      }
      assertEquals("live", cluster.sql("SELECT v FROM jobs WHERE id = 10"));

      Lease old = revoked(client, "tx");
      Lease next = acquire(client, "tx");
      AtomicBoolean ran = new AtomicBoolean();
      assertThrows(
          StaleFenceDataAccessException.class,
          () ->
              fenced.executeWithoutResult(
                  ConnectionGuard.of("tx", old.fence()),
                  status -> {
                    ran.set(true);
                    jdbc.update("INSERT INTO jobs VALUES (11, 'stale')");
                  }));
      assertFalse(ran.get(), "the stale holder's work ran");
      assertNull(cluster.sql("SELECT v FROM jobs WHERE id = 11"));
      client.release(next);
    }
  }

  @Test
  void transactionalRecipeGuardsTheCurrentTransaction() throws Exception {
    try (ConfigurableApplicationContext context = start(null)) {
      DataSource dataSource = context.getBean(DataSource.class);
      JdbcTemplate jdbc = context.getBean(JdbcTemplate.class);
      TransactionTemplate transaction =
          new TransactionTemplate(context.getBean(PlatformTransactionManager.class));
      FencedLockSupport lock = context.getBean(FencedLockRegistrySupport.class).obtain("recipe");
      assertTrue(lock.tryLock());
      try {
        transaction.executeWithoutResult(
            status -> {
              FencedTransactions.guardCurrentTransaction(dataSource, lock::guard);
              jdbc.update("INSERT INTO jobs VALUES (20, 'recipe')");
            });
      } finally {
        lock.unlock();
      }
      assertEquals("recipe", cluster.sql("SELECT v FROM jobs WHERE id = 20"));
      // Released: the lock's guard now refuses, and the transaction rolls back.
      assertThrows(
          LeaseLostDataAccessException.class,
          () ->
              transaction.executeWithoutResult(
                  status -> {
                    jdbc.update("INSERT INTO jobs VALUES (21, 'unguarded')");
                    FencedTransactions.guardCurrentTransaction(dataSource, lock::guard);
                  }));
      assertNull(cluster.sql("SELECT v FROM jobs WHERE id = 21"));
      assertThrows(
          IllegalStateException.class,
          () -> FencedTransactions.guardCurrentTransaction(dataSource, lock::guard));
    }
  }
}
