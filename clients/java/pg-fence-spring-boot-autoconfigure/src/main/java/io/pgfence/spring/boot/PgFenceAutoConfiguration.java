package io.pgfence.spring.boot;

import io.pgfence.Backoff;
import io.pgfence.FenceClient;
import io.pgfence.KeepOptions;
import io.pgfence.micrometer.PgFenceMetrics;
import io.pgfence.shedlock.PgFenceLockProvider;
import io.pgfence.spring.jdbc.FenceSqlExceptionTranslator;
import io.pgfence.spring.jdbc.FencedTransactions;
import io.pgfence.spring.support.FencedLockRegistrySupport;
import java.time.Duration;
import javax.sql.DataSource;
import org.springframework.beans.factory.config.BeanPostProcessor;
import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnClass;
import org.springframework.boot.autoconfigure.condition.ConditionalOnMissingBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnMissingClass;
import org.springframework.boot.autoconfigure.condition.ConditionalOnProperty;
import org.springframework.boot.autoconfigure.condition.ConditionalOnSingleCandidate;
import org.springframework.boot.context.properties.EnableConfigurationProperties;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.jdbc.support.JdbcAccessor;
import org.springframework.jdbc.support.SQLExceptionTranslator;
import org.springframework.transaction.PlatformTransactionManager;

/**
 * pg_fence for a Spring Boot 3 or 4 application with a {@link DataSource}: a {@link FenceClient},
 * the typed translation of PF001 and PF002 for its JdbcTemplates, {@link FencedTransactions} when
 * it has a transaction manager, the ShedLock {@link PgFenceLockProvider} when pg-fence-shedlock is
 * on the classpath, and the lock registry of its Spring Integration line when Spring Integration
 * and the matching pg_fence module are. Each bean backs off when the application defines its own of
 * its type; {@link PgFenceProperties} ({@code pgfence.*}) sets them.
 *
 * <p>Ordered after the DataSource and transaction manager auto-configurations by name, since Boot 4
 * moved them to other packages.
 */
@AutoConfiguration(
    afterName = {
      "org.springframework.boot.autoconfigure.jdbc.DataSourceAutoConfiguration",
      "org.springframework.boot.jdbc.autoconfigure.DataSourceAutoConfiguration",
      "org.springframework.boot.autoconfigure.jdbc.DataSourceTransactionManagerAutoConfiguration",
      "org.springframework.boot.jdbc.autoconfigure.DataSourceTransactionManagerAutoConfiguration",
      "org.springframework.boot.autoconfigure.transaction.TransactionAutoConfiguration",
      "org.springframework.boot.transaction.autoconfigure.TransactionAutoConfiguration"
    })
@ConditionalOnClass({DataSource.class, FenceClient.class, JdbcAccessor.class})
@ConditionalOnSingleCandidate(DataSource.class)
@EnableConfigurationProperties(PgFenceProperties.class)
public class PgFenceAutoConfiguration {
  private static final String LOCK_REGISTRY =
      "org.springframework.integration.support.locks.LockRegistry";
  private static final String DISTRIBUTED_LOCK =
      "org.springframework.integration.support.locks.DistributedLock";

  /** The auto-configuration; Boot makes it. */
  public PgFenceAutoConfiguration() {}

  /**
   * The client on the application's DataSource, with {@code pgfence.call-timeout}. Closed with the
   * context.
   *
   * @param dataSource the application's DataSource
   * @param properties {@code pgfence.*}
   * @return the client
   */
  @Bean(destroyMethod = "close")
  @ConditionalOnMissingBean
  public FenceClient fenceClient(DataSource dataSource, PgFenceProperties properties) {
    return new FenceClient(dataSource, Backoff.defaults(), properties.getCallTimeout());
  }

  /**
   * Fenced transactions of the application's transaction manager.
   *
   * @param transactionManager the application's transaction manager
   * @param dataSource the application's DataSource
   * @return the helper
   */
  @Bean
  @ConditionalOnMissingBean
  @ConditionalOnSingleCandidate(PlatformTransactionManager.class)
  public FencedTransactions fencedTransactions(
      PlatformTransactionManager transactionManager, DataSource dataSource) {
    return new FencedTransactions(transactionManager, dataSource);
  }

  /**
   * The typed translation of PF001 and PF002, on unless {@code
   * pgfence.jdbc.translate-exceptions=false}.
   */
  @Configuration(proxyBeanMethods = false)
  @ConditionalOnProperty(
      prefix = "pgfence.jdbc",
      name = "translate-exceptions",
      havingValue = "true",
      matchIfMissing = true)
  public static class ExceptionTranslation {

    /** Boot makes it. */
    public ExceptionTranslation() {}

    /**
     * The translator Boot's own JdbcTemplate takes (Boot 3.3 and later take an {@link
     * SQLExceptionTranslator} bean): PF001 and PF002 typed, every other error as JdbcTemplate's
     * default translation has it.
     *
     * @param dataSource the application's DataSource
     * @return the translator
     */
    @Bean
    @ConditionalOnMissingBean(SQLExceptionTranslator.class)
    public FenceSqlExceptionTranslator fenceSqlExceptionTranslator(DataSource dataSource) {
      // A JdbcTemplate's own choice of default (error codes or exception subclasses) is the
      // fallback.
      return new FenceSqlExceptionTranslator(new JdbcTemplate(dataSource).getExceptionTranslator());
    }

    /**
     * Puts the translation in front of every other JdbcTemplate's (an application's own, or one
     * given an application's translator), keeping theirs for every other error.
     *
     * @return the post-processor
     */
    @Bean
    public static BeanPostProcessor fenceSqlExceptionTranslatorInstaller() {
      return new BeanPostProcessor() {
        @Override
        public Object postProcessAfterInitialization(Object bean, String beanName) {
          if (bean instanceof JdbcAccessor) {
            FenceSqlExceptionTranslator.install((JdbcAccessor) bean);
          }
          return bean;
        }
      };
    }
  }

  /** A registry class's constructor of {@code (client, prefix, ttl, keep)}. */
  @FunctionalInterface
  interface RegistryConstructor<R extends FencedLockRegistrySupport<?>> {
    R make(FenceClient client, String prefix, Duration ttl, KeepOptions keep);
  }

  static <R extends FencedLockRegistrySupport<?>> R registry(
      RegistryConstructor<R> constructor, FenceClient client, PgFenceProperties properties) {
    R registry =
        constructor.make(
            client,
            properties.getRegistry().getPrefix(),
            properties.getRegistry().getTtl(),
            properties.getKeep().toKeepOptions());
    registry.setOwner(properties.getOwner());
    return registry;
  }

  /** The ShedLock provider, when pg-fence-shedlock is on the classpath. */
  @Configuration(proxyBeanMethods = false)
  @ConditionalOnClass(
      name = {
        "net.javacrumbs.shedlock.core.LockProvider",
        "io.pgfence.shedlock.PgFenceLockProvider"
      })
  public static class Shedlock {

    /** Boot makes it. */
    public Shedlock() {}

    /**
     * The provider, with keys {@code pgfence.shedlock.prefix + name}; backs off for any
     * application-defined ShedLock {@code LockProvider}.
     *
     * @param client the client
     * @param properties {@code pgfence.*}
     * @return the provider
     */
    @Bean
    @ConditionalOnMissingBean(type = "net.javacrumbs.shedlock.core.LockProvider")
    public PgFenceLockProvider pgFenceLockProvider(
        FenceClient client, PgFenceProperties properties) {
      PgFenceLockProvider.Builder builder =
          PgFenceLockProvider.builder(client).prefix(properties.getShedlock().getPrefix());
      if (properties.getShedlock().isKeepAlive()) {
        builder.keepAlive(properties.getKeep().toKeepOptions());
      }
      return builder.build();
    }
  }

  /**
   * The client's Micrometer meters, when pg-fence-micrometer and Micrometer are on the classpath:
   * Boot binds every {@code MeterBinder} bean to the application's registries.
   */
  @Configuration(proxyBeanMethods = false)
  @ConditionalOnClass(
      name = {
        "io.micrometer.core.instrument.MeterRegistry",
        "io.pgfence.micrometer.PgFenceMetrics"
      })
  public static class Metrics {

    /** Boot makes it. */
    public Metrics() {}

    /**
     * The meters of the context's client; backs off for an application-defined one.
     *
     * @param client the client
     * @return its meters, closed with the context (which stops their observer)
     */
    @Bean(destroyMethod = "close")
    @ConditionalOnMissingBean
    public PgFenceMetrics pgFenceMetrics(FenceClient client) {
      return new PgFenceMetrics(client);
    }
  }

  /** The lock registry of Spring Integration 7 (Boot 4), with pg-fence-spring-integration. */
  @Configuration(proxyBeanMethods = false)
  @ConditionalOnClass(name = {DISTRIBUTED_LOCK, "io.pgfence.spring.PgFenceLockRegistry"})
  @ConditionalOnMissingBean(type = LOCK_REGISTRY)
  public static class LockRegistry7 {

    /** Boot makes it. */
    public LockRegistry7() {}

    /**
     * The registry; backs off for any application-defined {@code LockRegistry}.
     *
     * @param client the client
     * @param properties {@code pgfence.*}
     * @return the registry
     */
    @Bean
    public io.pgfence.spring.PgFenceLockRegistry pgFenceLockRegistry(
        FenceClient client, PgFenceProperties properties) {
      return registry(io.pgfence.spring.PgFenceLockRegistry::new, client, properties);
    }
  }

  /**
   * The lock registry of Spring Integration 6 (Boot 3), with pg-fence-spring-integration-6: where
   * {@code DistributedLock}, which Spring Integration 7 added, is absent.
   */
  @Configuration(proxyBeanMethods = false)
  @ConditionalOnMissingClass(DISTRIBUTED_LOCK)
  @ConditionalOnClass(name = {LOCK_REGISTRY, "io.pgfence.spring6.PgFenceLockRegistry"})
  @ConditionalOnMissingBean(type = LOCK_REGISTRY)
  public static class LockRegistry6 {

    /**
     * The registry; backs off for any application-defined {@code LockRegistry}.
     *
     * @param client the client
     * @param properties {@code pgfence.*}
     * @return the registry
     */
    @Bean
    public io.pgfence.spring6.PgFenceLockRegistry pgFenceLockRegistry(
        FenceClient client, PgFenceProperties properties) {
      return registry(io.pgfence.spring6.PgFenceLockRegistry::new, client, properties);
    }

    /** Boot makes it. */
    public LockRegistry6() {}
  }
}
