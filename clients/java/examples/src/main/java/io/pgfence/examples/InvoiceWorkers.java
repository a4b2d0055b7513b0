package io.pgfence.examples;

import io.pgfence.AcquireOptions;
import io.pgfence.FenceClient;
import io.pgfence.KeepOptions;
import io.pgfence.KeptLease;
import io.pgfence.LeaseLostException;
import io.pgfence.StaleFenceException;
import io.pgfence.WaitTimedOutException;
import java.sql.Connection;
import java.time.Duration;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import javax.sql.DataSource;

/**
 * Per-invoice workers with fenced writes: four workers race for five invoices, each worker holding
 * a kept lease of an invoice while it works on it in steps, each step a fenced update. An
 * administrator revokes one lease mid-work: the worker's next write is refused by the server, its
 * kept lease is told (revoked) and it stops; another worker finishes the invoice under a higher
 * fence.
 *
 * <pre>
 * java io.pgfence.examples.InvoiceWorkers 'jdbc:postgresql://127.0.0.1:5432/postgres?user=postgres'
 * </pre>
 */
public final class InvoiceWorkers {
  private InvoiceWorkers() {}

  public static void main(String[] args) throws Exception {
    String url = Db.url(args);
    Db.execute(
        url,
        "DROP TABLE IF EXISTS invoices",
        "CREATE TABLE invoices (id int PRIMARY KEY, step int NOT NULL DEFAULT 0, done_by text)",
        "INSERT INTO invoices (id) SELECT generate_series(1, 5)");
    DataSource source = Db.source(url, "invoice_workers");
    AtomicInteger fencedWrites = new AtomicInteger();
    AtomicInteger refused = new AtomicInteger();
    AtomicInteger told = new AtomicInteger();
    java.util.concurrent.atomic.AtomicBoolean revoked =
        new java.util.concurrent.atomic.AtomicBoolean();
    String run = "invoice:" + System.nanoTime() + ":";
    KeepOptions keep =
        KeepOptions.defaults()
            .onLost(
                (lease, reason) -> {
                  told.incrementAndGet();
                  System.out.printf("%s lost (%s): stop%n", lease.key(), reason);
                });
    try (FenceClient client = new FenceClient(source)) {
      ExecutorService workers = Executors.newFixedThreadPool(4);
      for (int w = 0; w < 4; w++) {
        String worker = "worker-" + w;
        workers.submit(
            () -> {
              for (int round = 0; round < 50 && unfinished(url) > 0; round++) {
                for (int invoice = 1; invoice <= 5; invoice++) {
                  AcquireOptions opts = AcquireOptions.ttl(Duration.ofSeconds(3)).owner(worker);
                  try (KeptLease lease = client.hold(run + invoice, opts, keep);
                      Connection conn = source.getConnection()) {
                    while (lease.isHeld()) {
                      long step =
                          Long.parseLong(
                              Db.value(url, "SELECT step FROM invoices WHERE id = " + invoice));
                      if (step >= 5) {
                        break;
                      }
                      if (invoice == 3 && step == 2 && !revoked.getAndSet(true)) {
                        // An operator takes the invoice away mid-work: the next write is refused
                        // by the server, which tells the kept lease at once.
                        Db.execute(url, "SELECT fence.lease_revoke('" + run + invoice + "')");
                      }
                      try {
                        lease.fencedUpdate(
                            conn,
                            "invoices",
                            Map.of("step", step + 1, "done_by", worker),
                            Map.of("id", invoice));
                        fencedWrites.incrementAndGet();
                      } catch (LeaseLostException lost) {
                        refused.incrementAndGet();
                        System.out.printf(
                            "%s: write under %s refused before it was sent%n", worker, lease.key());
                      } catch (StaleFenceException stale) {
                        refused.incrementAndGet();
                        System.out.printf(
                            "%s: stale fence %d refused by the server%n", worker, stale.fence());
                      }
                      Thread.sleep(50);
                    }
                  } catch (WaitTimedOutException busy) {
                    // Another worker has this invoice.
                  } catch (Exception e) {
                    throw new IllegalStateException(e);
                  }
                }
              }
              return null;
            });
      }
      workers.shutdown();
      workers.awaitTermination(60, TimeUnit.SECONDS);
    }
    System.out.printf(
        "fenced writes %d, refused %d, leases told lost %d; invoices finished %s of 5%n",
        fencedWrites.get(),
        refused.get(),
        told.get(),
        Db.value(url, "SELECT count(*) FROM invoices WHERE step = 5"));
  }

  private static int unfinished(String url) throws java.sql.SQLException {
    return Integer.parseInt(Db.value(url, "SELECT count(*) FROM invoices WHERE step < 5"));
  }
}
