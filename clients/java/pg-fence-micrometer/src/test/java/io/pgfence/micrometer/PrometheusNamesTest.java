package io.pgfence.micrometer;

import static org.junit.jupiter.api.Assertions.assertTrue;

import io.micrometer.prometheusmetrics.PrometheusConfig;
import io.micrometer.prometheusmetrics.PrometheusMeterRegistry;
import io.pgfence.FenceClient;
import org.junit.jupiter.api.Test;
import org.postgresql.ds.PGSimpleDataSource;

/** The names the meters get in Prometheus, as the README lists them (no server needed). */
class PrometheusNamesTest {
  @Test
  void theMetersReadAsTheReadmeSays() {
    PrometheusMeterRegistry registry = new PrometheusMeterRegistry(PrometheusConfig.DEFAULT);
    // No connection is made until a call: the meters are registered at zero all the same.
    try (FenceClient client = new FenceClient(new PGSimpleDataSource());
        PgFenceMetrics metrics = new PgFenceMetrics(client)) {
      metrics.bindTo(registry);
      String scraped = registry.scrape();
      for (String line :
          new String[] {
            "pgfence_leases_kept 0",
            "pgfence_lease_losses_total{reason=\"revoked\"} 0",
            "pgfence_acquire_seconds_count{outcome=\"granted\"} 0",
            "pgfence_acquire_seconds_count{outcome=\"refused\"} 0",
            "pgfence_renew_seconds_count{outcome=\"ok\"} 0",
            "pgfence_renew_leases_count 0",
          }) {
        assertTrue(scraped.contains(line), "no " + line + " in:\n" + scraped);
      }
    }
  }
}
