package io.pgfence.examples;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pgfence.testing.Cluster;
import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.util.concurrent.TimeUnit;
import java.util.function.Predicate;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** Runs two {@link MeteredWorker}s against a real server and reads their meters over HTTP. */
class MeteredWorkerTest {
  private static Cluster cluster;
  private static final HttpClient HTTP = HttpClient.newHttpClient();

  @BeforeAll
  static void create() {
    cluster = new Cluster("metered_worker", 27814).create();
  }

  @AfterAll
  static void destroy() {
    cluster.destroy();
  }

  private static String scrape(MeteredWorker worker) throws IOException, InterruptedException {
    HttpRequest request =
        HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + worker.port() + "/metrics"))
            .build();
    HttpResponse<String> response = HTTP.send(request, HttpResponse.BodyHandlers.ofString());
    assertEquals(200, response.statusCode());
    return response.body();
  }

  /** The value of a line {@code name statistic value}; 0 when the meter is not there. */
  private static double value(String scraped, String meter, String statistic) {
    Matcher matcher =
        Pattern.compile(
                "^" + Pattern.quote(meter) + " " + statistic + " (\\S+)$", Pattern.MULTILINE)
            .matcher(scraped);
    return matcher.find() ? Double.parseDouble(matcher.group(1)) : 0;
  }

  /** Scrapes until {@code condition} holds (30 s at most: the machine may be loaded). */
  private static String awaitScrape(MeteredWorker worker, Predicate<String> condition, String what)
      throws Exception {
    long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
    while (true) {
      String scraped = scrape(worker);
      if (condition.test(scraped)) {
        return scraped;
      }
      assertTrue(System.nanoTime() < end, "not within 30 s: " + what + " in:\n" + scraped);
      Thread.sleep(50);
    }
  }

  @Test
  void theWorkersMetersTellItsLeaseItsRenewalsAndItsLoss() throws Exception {
    String url = cluster.url() + "?user=postgres";
    try (MeteredWorker first = MeteredWorker.start(url, 0)) {
      String scraped =
          awaitScrape(
              first,
              s -> value(s, "pgfence.renew{outcome=ok}", "count") >= 1,
              "a renewal of the kept lease");
      System.out.print(scraped);
      assertEquals(1, value(scraped, "pgfence.leases.kept", "value"));
      assertEquals(1, value(scraped, "pgfence.acquire{outcome=granted}", "count"));
      assertTrue(value(scraped, "pgfence.acquire{outcome=granted}", "total") > 0);
      assertEquals(0, value(scraped, "pgfence.lease.losses{reason=revoked}", "count"));
      try (MeteredWorker second = MeteredWorker.start(url, 0)) {
        String refused =
            awaitScrape(
                second,
                s -> value(s, "pgfence.acquire{outcome=refused}", "count") >= 1,
                "the second worker refused the key");
        assertEquals(0, value(refused, "pgfence.leases.kept", "value"));
        cluster.revoke(MeteredWorker.KEY);
        String lost =
            awaitScrape(
                first,
                s -> value(s, "pgfence.lease.losses{reason=revoked}", "count") == 1,
                "the revoked lease counted as lost");
        System.out.print(lost);
        // One of the two holds the key again: kept leases add up to one.
        long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
        while (value(scrape(first), "pgfence.leases.kept", "value")
                + value(scrape(second), "pgfence.leases.kept", "value")
            != 1) {
          assertTrue(System.nanoTime() < end, "no worker holds the key again");
          Thread.sleep(50);
        }
      }
    }
  }
}
