package io.pgfence.micrometer;

import io.micrometer.core.instrument.Counter;
import io.micrometer.core.instrument.DistributionSummary;
import io.micrometer.core.instrument.Gauge;
import io.micrometer.core.instrument.MeterRegistry;
import io.micrometer.core.instrument.Tag;
import io.micrometer.core.instrument.Tags;
import io.micrometer.core.instrument.Timer;
import io.micrometer.core.instrument.binder.MeterBinder;
import io.pgfence.FenceClient;
import io.pgfence.FenceObserver;
import io.pgfence.KeptLease;
import io.pgfence.LossReason;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * Micrometer meters of one {@link FenceClient}: its kept leases, their losses by reason, the
 * latency of its acquires and of its keeper's renewals, and its leaderships. Bind it to a registry
 * ({@code new PgFenceMetrics(client).bindTo(registry)}, or declare it as a bean in Spring Boot,
 * which binds every {@link MeterBinder}); it counts from its construction on.
 *
 * <table>
 *   <caption>The meters</caption>
 *   <tr><th>Name</th><th>Type</th><th>Tags</th><th>What</th></tr>
 *   <tr><td>{@code pgfence.leases.kept}</td><td>gauge</td><td></td>
 *       <td>kept leases held now</td></tr>
 *   <tr><td>{@code pgfence.lease.losses}</td><td>counter</td><td>{@code reason}</td>
 *       <td>kept leases lost while held, by {@link LossReason#wireName()}</td></tr>
 *   <tr><td>{@code pgfence.acquire}</td><td>timer</td><td>{@code outcome}</td>
 *       <td>acquires (waits included): {@code granted}, {@code refused}, {@code error}</td></tr>
 *   <tr><td>{@code pgfence.renew}</td><td>timer</td><td>{@code outcome}</td>
 *       <td>renewal calls of kept leases: {@code ok}, {@code lost}, {@code error}</td></tr>
 *   <tr><td>{@code pgfence.renew.leases}</td><td>distribution summary</td><td></td>
 *       <td>kept leases renewed by one call (the keeper batches them)</td></tr>
 *   <tr><td>{@code pgfence.leadership}</td><td>gauge</td><td>{@code election}</td>
 *       <td>1 while this client leads the election (the elector's key), else 0</td></tr>
 * </table>
 *
 * <p>The lease's key is no tag (keys are unbounded); an election's key is, since an application has
 * a few. Every meter also carries the tags given to {@link #PgFenceMetrics(FenceClient, Iterable)},
 * e.g. a client name when an application has several clients. {@link #close()} stops counting.
 */
public final class PgFenceMetrics implements MeterBinder, AutoCloseable {
  private final FenceClient client;
  private final Tags tags;
  private final List<MeterRegistry> registries = new CopyOnWriteArrayList<>();
  private final AtomicInteger kept = new AtomicInteger();
  private final Map<String, AtomicInteger> leading = new ConcurrentHashMap<>();
  private final Observer observer = new Observer();

  /**
   * Meters of {@code client}, with no tags of their own; counting starts now.
   *
   * @param client the client to measure
   */
  public PgFenceMetrics(FenceClient client) {
    this(client, Tags.empty());
  }

  /**
   * Meters of {@code client}, each also tagged with {@code tags}; counting starts now.
   *
   * @param client the client to measure
   * @param tags added to every meter (e.g. {@code Tags.of("client", "orders")})
   */
  public PgFenceMetrics(FenceClient client, Iterable<Tag> tags) {
    this.client = Objects.requireNonNull(client, "client");
    this.tags = Tags.of(Objects.requireNonNull(tags, "tags"));
    client.addObserver(observer);
  }

  /**
   * Registers the meters in {@code registry}; the counters and timers start at zero there (every
   * reason and outcome, so that a rate of zero shows as such).
   *
   * @param registry where the meters go
   */
  @Override
  public void bindTo(MeterRegistry registry) {
    Gauge.builder("pgfence.leases.kept", kept, AtomicInteger::get)
        .tags(tags)
        .description("Kept leases held now")
        .register(registry);
    for (LossReason reason : LossReason.values()) {
      losses(registry, reason);
    }
    for (FenceObserver.AcquireOutcome outcome : FenceObserver.AcquireOutcome.values()) {
      acquire(registry, outcome);
    }
    for (FenceObserver.RenewOutcome outcome : FenceObserver.RenewOutcome.values()) {
      renew(registry, outcome);
    }
    renewed(registry);
    // Added before the elections are registered: an election gained meanwhile is registered twice
    // rather than missed (registering is idempotent).
    registries.add(registry);
    for (String election : leading.keySet()) {
      leadership(registry, election);
    }
  }

  /** Stops counting: the client no longer tells these meters; registered meters stay. */
  @Override
  public void close() {
    client.removeObserver(observer);
  }

  private Counter losses(MeterRegistry registry, LossReason reason) {
    return Counter.builder("pgfence.lease.losses")
        .tags(tags)
        .tag("reason", reason.wireName())
        .description("Kept leases lost while held, by reason")
        .register(registry);
  }

  private Timer acquire(MeterRegistry registry, FenceObserver.AcquireOutcome outcome) {
    return Timer.builder("pgfence.acquire")
        .tags(tags)
        .tag("outcome", outcome.tagValue())
        .description("Acquires, retries and the wait for the key included")
        .register(registry);
  }

  private Timer renew(MeterRegistry registry, FenceObserver.RenewOutcome outcome) {
    return Timer.builder("pgfence.renew")
        .tags(tags)
        .tag("outcome", outcome.tagValue())
        .description("Renewal calls of kept leases")
        .register(registry);
  }

  private DistributionSummary renewed(MeterRegistry registry) {
    return DistributionSummary.builder("pgfence.renew.leases")
        .tags(tags)
        .description("Kept leases renewed by one renewal call")
        .register(registry);
  }

  private void leadership(MeterRegistry registry, String election) {
    AtomicInteger count = leading.get(election);
    Gauge.builder("pgfence.leadership", count, held -> held.get() > 0 ? 1 : 0)
        .tags(tags)
        .tag("election", election)
        .description("1 while this client leads the election, else 0")
        .register(registry);
  }

  /** What the client tells, recorded in every registry bound. */
  private final class Observer implements FenceObserver {
    @Override
    public void acquireFinished(Duration took, AcquireOutcome outcome) {
      for (MeterRegistry registry : registries) {
        acquire(registry, outcome).record(took);
      }
    }

    @Override
    public void renewFinished(Duration took, RenewOutcome outcome, int leases) {
      for (MeterRegistry registry : registries) {
        renew(registry, outcome).record(took);
        renewed(registry).record(leases);
      }
    }

    @Override
    public void keptLeaseStarted(KeptLease lease) {
      kept.incrementAndGet();
    }

    @Override
    public void keptLeaseEnded(KeptLease lease) {
      kept.decrementAndGet();
    }

    @Override
    public void leaseLost(KeptLease lease, LossReason reason) {
      for (MeterRegistry registry : registries) {
        losses(registry, reason).increment();
      }
    }

    @Override
    public void leadershipGained(String election) {
      boolean first = leading.putIfAbsent(election, new AtomicInteger()) == null;
      leading.get(election).incrementAndGet();
      if (first) {
        for (MeterRegistry registry : registries) {
          leadership(registry, election);
        }
      }
    }

    @Override
    public void leadershipLost(String election) {
      AtomicInteger count = leading.get(election);
      if (count != null) {
        count.decrementAndGet();
      }
    }
  }
}
