package io.pgfence.examples;

import com.sun.net.httpserver.HttpServer;
import io.micrometer.core.instrument.Measurement;
import io.micrometer.core.instrument.Meter;
import io.micrometer.core.instrument.MeterRegistry;
import io.micrometer.core.instrument.Tag;
import io.micrometer.core.instrument.simple.SimpleMeterRegistry;
import io.pgfence.AcquireOptions;
import io.pgfence.FenceClient;
import io.pgfence.KeepOptions;
import io.pgfence.KeptLease;
import io.pgfence.micrometer.PgFenceMetrics;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.sql.SQLException;
import java.time.Duration;
import java.util.Comparator;
import java.util.concurrent.TimeUnit;

/**
 * A worker that keeps a lease and serves its pg_fence meters over HTTP: it holds {@code
 * worker:metered} (waiting for it while another instance has it), works while it holds it, and
 * holds it again when it is lost. {@code GET /metrics} lists every meter's measurements, one a line
 * ({@code pgfence.leases.kept value 1.0}); a real application would bind {@link PgFenceMetrics} to
 * its Prometheus or OTLP registry instead (Spring Boot's actuator does it for a bean).
 *
 * <pre>
 * java io.pgfence.examples.MeteredWorker 'jdbc:postgresql://127.0.0.1:5432/postgres?user=postgres' 9464
 * curl http://127.0.0.1:9464/metrics
 * </pre>
 */
public final class MeteredWorker implements AutoCloseable {
  /** The key the worker keeps. */
  public static final String KEY = "worker:metered";

  private final FenceClient client;
  private final PgFenceMetrics metrics;
  private final HttpServer server;
  private final Thread worker;
  private volatile boolean stopping;

  private MeteredWorker(String url, int port) throws IOException {
    client = new FenceClient(Db.source(url, "metered_worker"));
    MeterRegistry registry = new SimpleMeterRegistry();
    metrics = new PgFenceMetrics(client);
    metrics.bindTo(registry);
    server = HttpServer.create(new InetSocketAddress("127.0.0.1", port), 0);
    server.createContext(
        "/metrics",
        exchange -> {
          byte[] body = render(registry).getBytes(StandardCharsets.UTF_8);
          exchange.getResponseHeaders().set("Content-Type", "text/plain; charset=utf-8");
          exchange.sendResponseHeaders(200, body.length);
          try (OutputStream out = exchange.getResponseBody()) {
            out.write(body);
          }
        });
    server.start();
    worker = new Thread(this::work, "metered-worker");
    worker.start();
  }

  /**
   * Starts the worker and its HTTP server.
   *
   * @param url the JDBC URL of the server
   * @param port the HTTP port (0: any free one, see {@link #port()})
   * @return the running worker; close it to stop
   * @throws IOException when the port cannot be bound
   */
  public static MeteredWorker start(String url, int port) throws IOException {
    return new MeteredWorker(url, port);
  }

  /**
   * The HTTP port the meters are served on.
   *
   * @return the bound port
   */
  public int port() {
    return server.getAddress().getPort();
  }

  /** Holds the key, works while held, and holds it again once lost, until stopped. */
  private void work() {
    while (!stopping) {
      try (KeptLease lease =
          client.hold(
              KEY,
              AcquireOptions.ttl(Duration.ofSeconds(3)).waitFor(Duration.ofSeconds(1)),
              KeepOptions.defaults())) {
        // One step of work a tenth of a second, each fenced with lease.guard(conn) in a real job.
        while (!stopping && lease.isHeld()) {
          TimeUnit.MILLISECONDS.sleep(100);
        }
      } catch (io.pgfence.WaitTimedOutException busy) {
        // Another instance works: wait again.
      } catch (SQLException e) {
        System.err.println("metered worker: " + e.getMessage() + "; trying again");
        sleepQuietly();
      } catch (InterruptedException e) {
        return;
      }
    }
  }

  private static void sleepQuietly() {
    try {
      TimeUnit.SECONDS.sleep(1);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  /** Every meter's measurements, one a line: {@code name{tag=value,...} statistic value}. */
  static String render(MeterRegistry registry) {
    StringBuilder out = new StringBuilder();
    registry.getMeters().stream()
        .sorted(Comparator.comparing((Meter meter) -> meter.getId().toString()))
        .forEach(
            meter -> {
              StringBuilder name = new StringBuilder(meter.getId().getName());
              if (!meter.getId().getTags().isEmpty()) {
                name.append('{');
                for (Tag tag : meter.getId().getTags()) {
                  if (name.charAt(name.length() - 1) != '{') {
                    name.append(',');
                  }
                  name.append(tag.getKey()).append('=').append(tag.getValue());
                }
                name.append('}');
              }
              for (Measurement measurement : meter.measure()) {
                out.append(name)
                    .append(' ')
                    .append(measurement.getStatistic().getTagValueRepresentation())
                    .append(' ')
                    .append(measurement.getValue())
                    .append('\n');
              }
            });
    return out.toString();
  }

  /** Stops the worker (its lease released), the HTTP server and the client. */
  @Override
  public void close() {
    stopping = true;
    try {
      worker.join();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
    server.stop(0);
    metrics.close();
    client.close();
  }

  /**
   * Runs until killed.
   *
   * @param args the JDBC URL, and the HTTP port (9464 when not given)
   * @throws Exception when the worker cannot start
   */
  public static void main(String[] args) throws Exception {
    int port = args.length > 1 ? Integer.parseInt(args[1]) : 9464;
    MeteredWorker worker = start(Db.url(args), port);
    System.out.println("metrics at http://127.0.0.1:" + worker.port() + "/metrics");
    Thread.currentThread().join();
  }
}
