package io.pgfence.spring.boot;

import io.pgfence.KeepOptions;
import java.time.Duration;
import org.springframework.boot.context.properties.ConfigurationProperties;

/**
 * The {@code pgfence.*} properties of the auto-configuration: how the {@code FenceClient} calls,
 * how kept leases are renewed, the lock registry's and the ShedLock provider's keys.
 */
@ConfigurationProperties(prefix = "pgfence")
public class PgFenceProperties {
  /** Bound on each try of a client call, beyond an acquire's wait. */
  private Duration callTimeout = Duration.ofSeconds(30);

  /** Owner named on the registry's leases; the session's application_name when unset. */
  private String owner;

  private final Keep keep = new Keep();
  private final Registry registry = new Registry();
  private final Shedlock shedlock = new Shedlock();
  private final Jdbc jdbc = new Jdbc();

  /** Properties with their defaults. */
  public PgFenceProperties() {}

  /**
   * The bound on each try of a client call (beyond an acquire's wait).
   *
   * @return {@code pgfence.call-timeout}, 30 s by default
   */
  public Duration getCallTimeout() {
    return callTimeout;
  }

  /**
   * Sets {@code pgfence.call-timeout}.
   *
   * @param callTimeout the bound on each try
   */
  public void setCallTimeout(Duration callTimeout) {
    this.callTimeout = callTimeout;
  }

  /**
   * The owner named on the registry's leases.
   *
   * @return {@code pgfence.owner}; null (the session's application_name) by default
   */
  public String getOwner() {
    return owner;
  }

  /**
   * Sets {@code pgfence.owner}.
   *
   * @param owner the owner label
   */
  public void setOwner(String owner) {
    this.owner = owner;
  }

  /**
   * How kept leases are renewed.
   *
   * @return {@code pgfence.keep.*}
   */
  public Keep getKeep() {
    return keep;
  }

  /**
   * The lock registry's settings.
   *
   * @return {@code pgfence.registry.*}
   */
  public Registry getRegistry() {
    return registry;
  }

  /**
   * The ShedLock provider's settings.
   *
   * @return {@code pgfence.shedlock.*}
   */
  public Shedlock getShedlock() {
    return shedlock;
  }

  /**
   * The JDBC exception translation's settings.
   *
   * @return {@code pgfence.jdbc.*}
   */
  public Jdbc getJdbc() {
    return jdbc;
  }

  /** {@code pgfence.keep.*}: {@link KeepOptions} of the registry's kept leases. */
  public static class Keep {
    /** How often kept leases are renewed; a third of the TTL when unset. */
    private Duration renewEvery;

    /** Time taken off each kept lease's local deadline; the client's default when unset. */
    private Duration margin;

    /** Bound on a kept lease's acquire try and on its release. */
    private Duration timeout = Duration.ofSeconds(10);

    /** The defaults: renew every ttl/3, the client's margin, a 10 s timeout. */
    public Keep() {}

    /**
     * How often to renew.
     *
     * @return {@code pgfence.keep.renew-every}; null (ttl/3) by default
     */
    public Duration getRenewEvery() {
      return renewEvery;
    }

    /**
     * Sets {@code pgfence.keep.renew-every}.
     *
     * @param renewEvery above zero and below the TTL less the margin
     */
    public void setRenewEvery(Duration renewEvery) {
      this.renewEvery = renewEvery;
    }

    /**
     * The margin taken off each lease's local deadline.
     *
     * @return {@code pgfence.keep.margin}; null (the client's default) by default
     */
    public Duration getMargin() {
      return margin;
    }

    /**
     * Sets {@code pgfence.keep.margin}.
     *
     * @param margin the margin
     */
    public void setMargin(Duration margin) {
      this.margin = margin;
    }

    /**
     * The bound on an acquire's try and on the release.
     *
     * @return {@code pgfence.keep.timeout}, 10 s by default
     */
    public Duration getTimeout() {
      return timeout;
    }

    /**
     * Sets {@code pgfence.keep.timeout}.
     *
     * @param timeout the bound
     */
    public void setTimeout(Duration timeout) {
      this.timeout = timeout;
    }

    /**
     * These properties as keep options.
     *
     * @return {@link KeepOptions#defaults()} with the properties set
     */
    public KeepOptions toKeepOptions() {
      KeepOptions options = KeepOptions.defaults().timeout(timeout);
      if (renewEvery != null) {
        options = options.renewEvery(renewEvery);
      }
      if (margin != null) {
        options = options.margin(margin);
      }
      return options;
    }
  }

  /** {@code pgfence.registry.*}: the Spring Integration lock registry. */
  public static class Registry {
    /** Put before each registry lock's key to make its lease key. */
    private String prefix = "spring:";

    /** Each registry lock's lease TTL: how long a holder that hangs keeps the key from others. */
    private Duration ttl = Duration.ofSeconds(30);

    /** The defaults: keys {@code spring:<key>}, a 30 s TTL. */
    public Registry() {}

    /**
     * The prefix of the registry's lease keys.
     *
     * @return {@code pgfence.registry.prefix}, {@code spring:} by default
     */
    public String getPrefix() {
      return prefix;
    }

    /**
     * Sets {@code pgfence.registry.prefix}.
     *
     * @param prefix put before each key
     */
    public void setPrefix(String prefix) {
      this.prefix = prefix;
    }

    /**
     * Each lock's lease TTL: how long a holder that hangs keeps the key from others.
     *
     * @return {@code pgfence.registry.ttl}, 30 s by default
     */
    public Duration getTtl() {
      return ttl;
    }

    /**
     * Sets {@code pgfence.registry.ttl}.
     *
     * @param ttl the TTL
     */
    public void setTtl(Duration ttl) {
      this.ttl = ttl;
    }
  }

  /** {@code pgfence.shedlock.*}: the ShedLock provider. */
  public static class Shedlock {
    /** Put before each ShedLock lock's name to make its lease key. */
    private String prefix = "shedlock:";

    /**
     * Whether each ShedLock lock is renewed (with the pgfence.keep options) while its task runs,
     * for any lockAtMostFor; without it a task that overruns lockAtMostFor loses its lock.
     */
    private boolean keepAlive;

    /** The defaults: keys {@code shedlock:<name>}, no renewal. */
    public Shedlock() {}

    /**
     * Whether the client's keeper renews each lock while its task runs (with the {@code
     * pgfence.keep.*} options), for any {@code lockAtMostFor}; without it a task that overruns
     * {@code lockAtMostFor} loses its lock.
     *
     * @return {@code pgfence.shedlock.keep-alive}, false by default
     */
    public boolean isKeepAlive() {
      return keepAlive;
    }

    /**
     * Sets {@code pgfence.shedlock.keep-alive}.
     *
     * @param keepAlive true to renew each lock while its task runs
     */
    public void setKeepAlive(boolean keepAlive) {
      this.keepAlive = keepAlive;
    }

    /**
     * The prefix of the provider's lease keys.
     *
     * @return {@code pgfence.shedlock.prefix}, {@code shedlock:} by default
     */
    public String getPrefix() {
      return prefix;
    }

    /**
     * Sets {@code pgfence.shedlock.prefix}.
     *
     * @param prefix put before each lock's name
     */
    public void setPrefix(String prefix) {
      this.prefix = prefix;
    }
  }

  /** {@code pgfence.jdbc.*}: the exception translation. */
  public static class Jdbc {
    /**
     * Whether PF001 and PF002 arrive typed (LeaseLostDataAccessException,
     * StaleFenceDataAccessException) from the context's JdbcTemplates.
     */
    private boolean translateExceptions = true;

    /** The defaults: translation on. */
    public Jdbc() {}

    /**
     * Whether PF001 and PF002 arrive as typed exceptions from the context's JdbcTemplates.
     *
     * @return {@code pgfence.jdbc.translate-exceptions}, true by default
     */
    public boolean isTranslateExceptions() {
      return translateExceptions;
    }

    /**
     * Sets {@code pgfence.jdbc.translate-exceptions}.
     *
     * @param translateExceptions false to leave the JdbcTemplates' translation alone
     */
    public void setTranslateExceptions(boolean translateExceptions) {
      this.translateExceptions = translateExceptions;
    }
  }
}
