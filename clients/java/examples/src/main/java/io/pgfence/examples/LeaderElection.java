package io.pgfence.examples;

import io.pgfence.FenceClient;
import io.pgfence.KeepOptions;
import io.pgfence.spring.PgFenceLockRegistry;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicReference;
import org.springframework.integration.leader.Candidate;
import org.springframework.integration.leader.Context;
import org.springframework.integration.support.leader.LockRegistryLeaderInitiator;

/**
 * Leader election with Spring Integration's LockRegistryLeaderInitiator on the pg_fence lock
 * registry: three candidates, one leads; its lease is revoked twice (as an operator would, or as a
 * lost lease is), and each time another is elected with a higher fence; each leader guards its
 * writes with its fence.
 *
 * <pre>
 * java io.pgfence.examples.LeaderElection 'jdbc:postgresql://127.0.0.1:5432/postgres?user=postgres'
 * </pre>
 */
public final class LeaderElection {
  private LeaderElection() {}

  public static void main(String[] args) throws Exception {
    String url = Db.url(args);
    String role = "scheduler-" + System.nanoTime();
    AtomicReference<String> leader = new AtomicReference<>();
    List<LockRegistryLeaderInitiator> initiators = new ArrayList<>();
    List<FenceClient> clients = new ArrayList<>();
    for (String node : List.of("node-1", "node-2", "node-3")) {
      FenceClient client = new FenceClient(Db.source(url, "leader_" + node));
      clients.add(client);
      PgFenceLockRegistry registry =
          new PgFenceLockRegistry(
              client, "election:", Duration.ofSeconds(3), KeepOptions.defaults());
      LockRegistryLeaderInitiator initiator =
          new LockRegistryLeaderInitiator(
              registry,
              new Candidate() {
                @Override
                public String getRole() {
                  return role;
                }

                @Override
                public String getId() {
                  return node;
                }

                @Override
                public void onGranted(Context context) {
                  long fence = registry.obtain(role).fence().orElseThrow();
                  System.out.printf("%s leads, fence %d%n", node, fence);
                  leader.set(node);
                }

                @Override
                public void onRevoked(Context context) {
                  System.out.printf("%s stopped leading%n", node);
                  leader.compareAndSet(node, null);
                }
              });
      initiators.add(initiator);
      initiator.start();
    }
    int elections = 1;
    waitForLeader(leader);
    for (int revoke = 0; revoke < 2; revoke++) {
      String deposed = leader.get();
      long start = System.nanoTime();
      Db.execute(url, "SELECT fence.lease_revoke('election:" + role + "')");
      long end = System.nanoTime() + Duration.ofSeconds(30).toNanos();
      while (leader.get() == null || leader.get().equals(deposed)) {
        if (System.nanoTime() > end) {
          throw new IllegalStateException("no new leader within 30 s");
        }
        Thread.sleep(5);
      }
      elections++;
      System.out.printf(
          "revoked %s: %s elected %.0f ms later%n",
          deposed, leader.get(), (System.nanoTime() - start) / 1e6);
    }
    for (LockRegistryLeaderInitiator initiator : initiators) {
      initiator.stop();
      initiator.destroy();
    }
    clients.forEach(FenceClient::close);
    System.out.printf("leaders elected %d%n", elections);
  }

  private static void waitForLeader(AtomicReference<String> leader) throws InterruptedException {
    long end = System.nanoTime() + Duration.ofSeconds(30).toNanos();
    while (leader.get() == null && System.nanoTime() < end) {
      Thread.sleep(5);
    }
  }
}
