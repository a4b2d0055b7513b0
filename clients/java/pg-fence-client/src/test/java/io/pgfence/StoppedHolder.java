package io.pgfence;

import io.pgfence.testing.Cluster;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.time.Duration;

/**
 * The child JVM of {@link StoppedChildTest}: holds a lease and writes under it, each write guarded
 * in its own transaction, printing what happens; the test stops it (SIGSTOP) past its TTL.
 *
 * <p>Prints {@code HELD fence}, {@code WROTE n} after each committed write, {@code TOLD reason}
 * when the listener is told, {@code REFUSED_LOCALLY reason} when the kept lease refuses a write,
 * and {@code REFUSED_BY_SERVER sqlstate} for a write with the old fence sent anyway.
 */
public final class StoppedHolder {
  private StoppedHolder() {}

  public static void main(String[] args) throws Exception {
    int port = Integer.parseInt(args[0]);
    String key = args[1];
    Duration ttl = Duration.ofMillis(Long.parseLong(args[2]));
    try (FenceClient client = new FenceClient(Cluster.dataSource("stopped_child", port));
        KeptLease lease =
            client.hold(
                key,
                AcquireOptions.ttl(ttl),
                KeepOptions.defaults()
                    .onLost((kept, reason) -> System.out.println("TOLD " + reason.wireName())));
        Connection conn = Cluster.dataSource("stopped_child_writer", port).getConnection();
        PreparedStatement write =
            conn.prepareStatement(
                "UPDATE child_writes SET writer = 'child', fence = ? WHERE id = 1")) {
      System.out.println("HELD " + lease.fence());
      conn.setAutoCommit(false);
      for (int n = 1; ; n++) {
        try {
          lease.guard(conn);
          write.setLong(1, lease.fence());
          write.executeUpdate();
          conn.commit();
          System.out.println("WROTE " + n);
        } catch (LeaseLostException lost) {
          conn.rollback();
          System.out.println(
              "REFUSED_LOCALLY " + lost.reason().map(LossReason::wireName).orElse("?"));
          try {
            PgFence.fenceGuard(conn, key, lease.fence());
            write.executeUpdate();
            conn.commit();
            System.out.println("WROTE_STALE");
          } catch (StaleFenceException stale) {
            conn.rollback();
            System.out.println("REFUSED_BY_SERVER " + stale.getSQLState());
          }
          return;
        }
        Thread.sleep(300);
      }
    }
  }
}
