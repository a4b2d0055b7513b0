package io.pgfence;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.time.Duration;
import java.time.Instant;
import java.time.OffsetDateTime;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import javax.sql.DataSource;

/**
 * A client's keeper: it renews every kept lease of its {@link FenceClient} (but session-bound ones,
 * whose session is the lease) over at most {@code size} connections of its own, from the keeper's
 * DataSource, opened with its first kept lease and reused. The renewals that are due are sent
 * together, 64 leases a call at most, with {@code fence.lease_renew_many}: several calls at once
 * over its connections when more are due. Each lease keeps its own deadline, timer and told loss
 * ({@link KeptLease}); the keeper only carries the calls.
 *
 * <p>It also releases the tokens of grants whose callers gave up ({@link #releaseToken}), on the
 * same connections: the application's pool may be the very thing that made the caller give up.
 */
final class Keeper implements AutoCloseable {
  /** The server's limit on the leases of one lease_renew_many call. */
  static final int BATCH = 64;

  /** Connections unused this long with nothing kept are closed; the next lease opens them again. */
  private static final long IDLE_CLOSE_NANOS = TimeUnit.SECONDS.toNanos(10);

  private static final int SAMPLES = 20_000;

  private final FenceClient client;
  private final DataSource source;
  private final int size;
  private final Object lock = new Object();
  private final Set<KeptLease> leases = new LinkedHashSet<>(); // guarded by lock
  private final ArrayDeque<Release> releases = new ArrayDeque<>(); // guarded by lock
  private final ArrayDeque<Connection> idle = new ArrayDeque<>(); // guarded by lock

  /** Each connection's statement_timeout, in ms, so that it is set again only when it changes. */
  private final Map<Connection, Long> statementTimeouts = new HashMap<>(); // guarded by lock

  private final long[] latencies = new long[SAMPLES]; // guarded by lock
  private int latencyCount; // guarded by lock
  private int busy; // guarded by lock
  private int open; // guarded by lock
  private long connectionsMade; // guarded by lock
  private long emptySince = System.nanoTime(); // guarded by lock
  private boolean closed; // guarded by lock
  private final ExecutorService workers;
  private final Thread scheduler;

  /** A token to release: a grant whose reply its caller never took. */
  private record Release(String key, UUID token, long untilNanos, int tries) {}

  Keeper(FenceClient client, DataSource source, int size) {
    if (size < 1) {
      throw new IllegalArgumentException("a keeper needs at least one connection: " + size);
    }
    this.client = client;
    this.source = source;
    this.size = size;
    // The calls in flight are at most `size` (counted by `busy`); a thread more is made when one is
    // still telling a slow observer of its call, which holds no connection or lock by then.
    this.workers =
        Executors.newCachedThreadPool(
            runnable -> {
              Thread thread = new Thread(runnable, "pg-fence-keeper-call");
              thread.setDaemon(true);
              return thread;
            });
    this.scheduler = new Thread(this::schedule, "pg-fence-keeper");
    this.scheduler.setDaemon(true);
    this.scheduler.start();
  }

  /** Starts keeping {@code lease}: renewed when due (at once if it is due already). */
  void add(KeptLease lease) {
    synchronized (lock) {
      if (closed) {
        throw new IllegalStateException("the client is closed");
      }
      leases.add(lease);
      lock.notifyAll();
    }
  }

  /**
   * Opens the keeper's connections that are not open yet, before a kept lease's acquire: taken once
   * from the keeper's DataSource (the application's pool when the client was given no other) and
   * held while it keeps any lease, so that a pool exhausted later starves no renewal. Given back
   * once it has kept nothing for a while, or at close. A connection the DataSource cannot give now
   * is opened when a renewal needs it.
   */
  void reserve() {
    while (true) {
      synchronized (lock) {
        if (closed || open >= size) {
          return;
        }
        open++;
        connectionsMade++;
      }
      Connection conn = null;
      try {
        conn = source.getConnection();
        FenceClient.prepare(conn, Duration.ofSeconds(30));
      } catch (SQLException e) {
        if (conn != null) {
          FenceClient.abort(conn);
        }
        synchronized (lock) {
          open--;
          connectionsMade--;
        }
        return;
      }
      synchronized (lock) {
        if (closed) {
          open--;
        } else {
          idle.add(conn);
          emptySince = System.nanoTime();
          lock.notifyAll();
          conn = null;
        }
      }
      if (conn != null) {
        FenceClient.giveBack(conn);
      }
    }
  }

  /** Whether {@code thread} holds a kept lease of {@code key} here now. */
  boolean heldBy(String key, Thread thread) {
    List<KeptLease> kept;
    synchronized (lock) {
      kept = new ArrayList<>(leases);
    }
    for (KeptLease lease : kept) {
      if (lease.holder() == thread && lease.keys().contains(key) && lease.isHeld()) {
        return true;
      }
    }
    return false;
  }

  /** Wakes the scheduler: a lease's due time moved earlier, or it ended. */
  void wake() {
    synchronized (lock) {
      lock.notifyAll();
    }
  }

  /**
   * Releases {@code token}'s lease of {@code key} on the keeper's connections, retried until the
   * server answers or {@code ttl} has passed (by then the lease, if granted, has expired).
   */
  void releaseToken(String key, UUID token, Duration ttl) {
    synchronized (lock) {
      if (closed) {
        return;
      }
      releases.add(new Release(key, token, System.nanoTime() + ttl.toNanos(), 0));
      lock.notifyAll();
    }
  }

  /** What the keeper did so far: for measurements and tests. */
  record Stats(long connectionsMade, int connectionsOpen, long[] latencyNanos) {}

  Stats stats() {
    synchronized (lock) {
      long[] copy = new long[Math.min(latencyCount, SAMPLES)];
      System.arraycopy(latencies, 0, copy, 0, copy.length);
      return new Stats(connectionsMade, open, copy);
    }
  }

  /** The scheduler: sends what is due, in batches, over free connections; sleeps until more is. */
  private void schedule() {
    synchronized (lock) {
      while (!closed) {
        long now = System.nanoTime();
        long next = now + TimeUnit.SECONDS.toNanos(1);
        leases.removeIf(lease -> !lease.keeping());
        if (leases.isEmpty() && releases.isEmpty()) {
          if (busy == 0 && !idle.isEmpty() && now - emptySince > IDLE_CLOSE_NANOS) {
            while (!idle.isEmpty()) {
              closeConnection(idle.poll(), false);
            }
          }
        } else {
          emptySince = now;
        }
        List<KeptLease> due = new ArrayList<>();
        List<KeptLease> soon = new ArrayList<>();
        for (KeptLease lease : leases) {
          if (lease.inFlight()) {
            continue;
          }
          long at = lease.dueNanos();
          if (at - now <= 0) {
            due.add(lease);
          } else {
            if (at - now <= lease.earlyNanos()) {
              soon.add(lease);
            }
            if (at - next < 0) {
              next = at;
            }
          }
        }
        // A call sent anyway takes along the leases due within a tenth of their period: renewals
        // then fall into step, and fewer, fuller calls carry them.
        if (!due.isEmpty()) {
          due.addAll(soon);
        }
        // The nearest deadlines go first when there are more than the connections can carry.
        due.sort(Comparator.comparingLong(KeptLease::deadlineNanos));
        List<Release> dueReleases = new ArrayList<>();
        while (!releases.isEmpty()) {
          dueReleases.add(releases.poll());
        }
        int at = 0;
        while ((at < due.size() || !dueReleases.isEmpty()) && busy < size) {
          List<KeptLease> batch = new ArrayList<>();
          int keys = 0;
          while (at < due.size() && keys + due.get(at).keys().size() <= BATCH) {
            KeptLease lease = due.get(at++);
            lease.inFlight(true);
            batch.add(lease);
            keys += lease.keys().size();
          }
          List<Release> toRelease = new ArrayList<>(dueReleases);
          dueReleases.clear();
          busy++;
          workers.execute(() -> call(batch, toRelease));
        }
        releases.addAll(dueReleases);
        if (at < due.size() || !releases.isEmpty()) {
          next = now; // more is due: sent when a connection is free (a call's end wakes us)
          if (busy < size) {
            next = now + TimeUnit.MILLISECONDS.toNanos(10);
          }
        }
        long wait = next - System.nanoTime();
        if (wait > 0 || busy >= size) {
          try {
            TimeUnit.NANOSECONDS.timedWait(lock, Math.max(wait, TimeUnit.MILLISECONDS.toNanos(1)));
          } catch (InterruptedException interrupted) {
            return;
          }
        }
      }
    }
  }

  /** One worker's call: the batch's renewals, then the releases, on one keeper connection. */
  private void call(List<KeptLease> batch, List<Release> toRelease) {
    Connection conn = null;
    List<KeptLease> locked = new ArrayList<>();
    // Told once the renewal locks and the connection are given back: a listener or observer that
    // blocks must hold up neither the other leases' renewals nor stopRenewing.
    List<Runnable> tell = new ArrayList<>();
    try {
      // A lease whose elector is proclaiming or handing off must not meet a renewal: it waits.
      for (KeptLease lease : batch) {
        if (lease.renewing().tryLock()) {
          locked.add(lease);
        } else {
          lease.postpone(TimeUnit.MILLISECONDS.toNanos(10));
        }
      }
      List<KeptLease> live = new ArrayList<>();
      for (KeptLease lease : locked) {
        if (lease.keeping()) {
          live.add(lease);
        }
      }
      if (!live.isEmpty()) {
        // A call that hangs is abandoned with its connection in time for another try.
        long limit = Long.MAX_VALUE;
        long statementMillis = Long.MAX_VALUE;
        for (KeptLease lease : live) {
          limit = Math.min(limit, lease.tryBoundNanos());
          statementMillis = Math.min(statementMillis, lease.everyMillis());
        }
        long sent = System.nanoTime();
        FenceObserver.RenewOutcome outcome = FenceObserver.RenewOutcome.ERROR;
        try {
          conn = connection(limit, statementMillis);
          outcome =
              renew(conn, live, limit, tell)
                  ? FenceObserver.RenewOutcome.OK
                  : FenceObserver.RenewOutcome.LOST;
          record(System.nanoTime() - sent);
        } catch (SQLException e) {
          closeConnection(conn, true);
          conn = null;
          for (KeptLease lease : live) {
            lease.renewFailed();
          }
        }
        Observers observers = client.observers();
        if (observers.any()) {
          Duration took = Duration.ofNanos(System.nanoTime() - sent);
          FenceObserver.RenewOutcome told = outcome;
          int leases = live.size();
          tell.add(() -> observers.renewFinished(took, told, leases));
        }
      }
      if (!toRelease.isEmpty()) {
        conn = release(conn, toRelease);
      }
    } finally {
      for (KeptLease lease : locked) {
        lease.renewing().unlock();
      }
      for (KeptLease lease : batch) {
        lease.inFlight(false);
      }
      synchronized (lock) {
        busy--;
        if (conn != null) {
          if (closed) {
            closeConnection(conn, false);
          } else {
            idle.push(conn);
          }
        }
        lock.notifyAll();
      }
    }
    for (Runnable told : tell) {
      told.run();
    }
  }

  /**
   * lease_renew_many for {@code live}, each lease told its own answer; false when one is lost. The
   * losses are declared by {@code tell}, run after the call.
   */
  private boolean renew(Connection conn, List<KeptLease> live, long limitNanos, List<Runnable> tell)
      throws SQLException {
    List<String> keys = new ArrayList<>();
    List<UUID> tokens = new ArrayList<>();
    List<String> ttls = new ArrayList<>();
    for (KeptLease lease : live) {
      for (String key : lease.keys()) {
        keys.add(key);
        tokens.add(lease.token());
        ttls.add(Sql.interval(lease.ttl()));
      }
    }
    conn.setNetworkTimeout(FenceClient.DIRECT, millis(limitNanos));
    long sent = System.nanoTime();
    List<Instant> answers = new ArrayList<>(keys.size());
    try (PreparedStatement statement =
        conn.prepareStatement(
            "SELECT expires_at FROM fence.lease_renew_many(?::text[], ?::uuid[], ?::interval[])")) {
      statement.setArray(1, conn.createArrayOf("text", keys.toArray()));
      statement.setArray(2, conn.createArrayOf("uuid", tokens.toArray()));
      statement.setArray(3, conn.createArrayOf("text", ttls.toArray()));
      try (ResultSet rows = statement.executeQuery()) {
        while (rows.next()) {
          OffsetDateTime at = rows.getObject(1, OffsetDateTime.class);
          answers.add(at == null ? null : at.toInstant());
        }
      }
    }
    if (answers.size() != keys.size()) {
      throw new SQLException("lease_renew_many answered " + answers.size() + " of " + keys.size());
    }
    int row = 0;
    boolean allHeld = true;
    for (KeptLease lease : live) {
      Instant earliest = null;
      boolean held = true;
      for (int i = 0; i < lease.keys().size(); i++) {
        Instant at = answers.get(row++);
        if (at == null) {
          held = false;
        } else if (earliest == null || at.isBefore(earliest)) {
          earliest = at;
        }
      }
      if (held) {
        if (!lease.renewed(sent, earliest)) {
          tell.add(lease::state);
        }
      } else {
        allHeld = false;
        tell.add(lease.notHeld(reasonOn(conn, lease)));
      }
    }
    return allHeld;
  }

  /** Why a lease the server no longer holds ended, asked on the same connection; null: no word. */
  private static LossReason reasonOn(Connection conn, KeptLease lease) {
    try {
      conn.setNetworkTimeout(FenceClient.DIRECT, 1000);
      String ended = PgFence.firstEnded(conn, lease.keys(), lease.token());
      if (ended == null) {
        return null;
      }
      LossReason reason = LossReason.ofStatus(ended, lease.lease().durable());
      return reason == null ? LossReason.UNKNOWN : reason;
    } catch (SQLException e) {
      return null;
    }
  }

  /** The releases, each retried later (until its TTL has passed) when this try fails. */
  private Connection release(Connection conn, List<Release> toRelease) {
    List<Release> again = new ArrayList<>();
    for (Release release : toRelease) {
      long left = release.untilNanos() - System.nanoTime();
      if (left <= 0) {
        continue;
      }
      try {
        if (conn == null) {
          conn = connection(Math.min(left, TimeUnit.SECONDS.toNanos(5)), Long.MAX_VALUE);
        }
        conn.setNetworkTimeout(
            FenceClient.DIRECT, millis(Math.min(left, TimeUnit.SECONDS.toNanos(5))));
        PgFence.release(conn, release.key(), release.token());
      } catch (SQLException e) {
        closeConnection(conn, true);
        conn = null;
        again.add(release);
      }
    }
    if (!again.isEmpty()) {
      Thread retry =
          new Thread(
              () -> {
                for (Release release : again) {
                  long delay = client.backoffDelay(release.tries()).toNanos() + System.nanoTime();
                  try {
                    TimeUnit.NANOSECONDS.sleep(Math.max(0, delay - System.nanoTime()));
                  } catch (InterruptedException interrupted) {
                    return;
                  }
                  synchronized (lock) {
                    if (!closed) {
                      releases.add(
                          new Release(
                              release.key(),
                              release.token(),
                              release.untilNanos(),
                              release.tries() + 1));
                      lock.notifyAll();
                    }
                  }
                }
              },
              "pg-fence-keeper-release");
      retry.setDaemon(true);
      retry.start();
    }
    return conn;
  }

  /** An idle keeper connection, or a new one (counted), in autocommit. */
  private Connection connection(long limitNanos, long statementMillis) throws SQLException {
    Connection conn;
    synchronized (lock) {
      conn = idle.poll();
    }
    if (conn == null) {
      conn = source.getConnection();
      synchronized (lock) {
        open++;
        connectionsMade++;
      }
      try {
        FenceClient.prepare(conn, Duration.ofNanos(limitNanos));
      } catch (SQLException e) {
        closeConnection(conn, true);
        throw e;
      }
    }
    Long current;
    synchronized (lock) {
      current = statementTimeouts.get(conn);
    }
    // A renewal stuck on the server must not keep its keys' locks past the next try.
    if (statementMillis != Long.MAX_VALUE && (current == null || current != statementMillis)) {
      conn.setNetworkTimeout(FenceClient.DIRECT, millis(limitNanos));
      try (Statement statement = conn.createStatement()) {
        statement.execute("SET statement_timeout = " + Math.max(1, statementMillis));
      } catch (SQLException e) {
        closeConnection(conn, true);
        throw e;
      }
      synchronized (lock) {
        statementTimeouts.put(conn, statementMillis);
      }
    }
    return conn;
  }

  private void closeConnection(Connection conn, boolean broken) {
    if (conn == null) {
      return;
    }
    List<Connection> suspect = new ArrayList<>();
    synchronized (lock) {
      open--;
      statementTimeouts.remove(conn);
      if (broken) {
        // The idle ones went the same way (opened together, ahead of need): a try after a hang
        // takes a new connection, not another that may hang the same.
        suspect.addAll(idle);
        idle.clear();
        open -= suspect.size();
        suspect.forEach(statementTimeouts::remove);
      }
    }
    if (broken) {
      FenceClient.abort(conn);
      suspect.forEach(FenceClient::abort);
    } else {
      FenceClient.closeQuietly(conn);
    }
  }

  private void record(long nanos) {
    synchronized (lock) {
      latencies[latencyCount % SAMPLES] = nanos;
      latencyCount++;
    }
  }

  private static int millis(long nanos) {
    return (int) Math.max(1, Math.min(Integer.MAX_VALUE, nanos / 1_000_000 + 1));
  }

  /** Stops renewing (the leases end at their deadlines) and closes the keeper's connections. */
  @Override
  public void close() {
    synchronized (lock) {
      closed = true;
      while (!idle.isEmpty()) {
        closeConnection(idle.poll(), false);
      }
      lock.notifyAll();
    }
    workers.shutdown();
    scheduler.interrupt();
  }
}
