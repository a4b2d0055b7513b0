package io.pgfence;

import java.sql.Connection;
import java.sql.SQLException;
import java.time.Duration;
import java.util.List;
import java.util.Objects;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.Consumer;
import org.postgresql.PGConnection;

/**
 * Leader election on a key, after etcd's {@code concurrency.Election} and client-go's leader
 * election: the leader is the holder of the key's lease, its value the lease's owner, and its fence
 * fences its writes. {@link #campaign} waits until elected; {@link #observe()} follows the key's
 * leaders; {@link #leader()} tells who leads now. Closing the elector cancels a campaign in
 * progress (on the server: nothing is left granted), stops the observers and ends its leaderships
 * (released, or left to expire with {@code releaseOnCancel(false)}). Thread-safe.
 *
 * <pre>{@code
 * try (Elector elector = new Elector(client, "scheduler", ElectorOptions.ttl(Duration.ofSeconds(10))
 *         .onStoppedLeading(reason -> log.info("stopped leading: {}", reason)));
 *     Leadership leadership = elector.campaign("node-1 at 10.0.0.1:8080")) {
 *   while (leadership.isLeader()) {
 *     conn.setAutoCommit(false);
 *     leadership.guard(conn);          // refused once deposed
 *     ...
 *     conn.commit();
 *   }
 * }
 * }</pre>
 */
public final class Elector implements AutoCloseable {
  /** How long one wait of a campaign lasts before it is asked again (it stays in the queue). */
  static final Duration CAMPAIGN_WAIT = Duration.ofSeconds(60);

  private final FenceClient client;
  private final String key;
  private final ElectorOptions options;
  private volatile boolean closed;
  private final Set<Connection> busy = ConcurrentHashMap.newKeySet();
  private final List<Leadership> leaderships = new CopyOnWriteArrayList<>();
  private final List<Observer> observers = new CopyOnWriteArrayList<>();
  private final Thread watcher;

  /**
   * An elector of {@code key}'s leader; it campaigns only when asked ({@link #campaign}).
   *
   * @param client the client whose keeper keeps the leader's lease
   * @param key the key the candidates share
   * @param options the leader's TTL, how its lease is kept, who is told of the leaders
   */
  public Elector(FenceClient client, String key, ElectorOptions options) {
    this.client = Objects.requireNonNull(client);
    this.key = Objects.requireNonNull(key);
    this.options = Objects.requireNonNull(options);
    if (options.onNewLeader() != null) {
      watcher = new Thread(this::watch, "pg-fence-elector " + key);
      watcher.setDaemon(true);
      watcher.start();
    } else {
      watcher = null;
    }
  }

  /**
   * The key the candidates share.
   *
   * @return the leadership lease's key
   */
  public String key() {
    return key;
  }

  /**
   * {@link #campaign(String, Duration)} with no end: waits until elected.
   *
   * @param value the lease's owner while this candidate leads, which observers see (at most 256
   *     bytes in UTF-8)
   * @return the leadership, kept renewed
   * @throws WaitCancelledException when the elector is closed (or the thread interrupted) first
   * @throws SQLException a server error that no retry can help (a wrong key, a refused value)
   */
  public Leadership campaign(String value) throws SQLException {
    return campaign(value, null);
  }

  /**
   * Waits until elected with {@code value} (the lease's owner, which observers see), at most {@code
   * wait} (null: until elected; {@link WaitTimedOutException} when it runs out), in waits of 60 s
   * at most, each asked again at once; returns the leadership, kept renewed, after telling {@code
   * onStartedLeading}. {@link WaitCancelledException} when the elector is closed meanwhile (the
   * wait is cancelled on the server: nothing is left granted).
   *
   * @param value the lease's owner while this candidate leads, which observers see (at most 256
   *     bytes in UTF-8)
   * @param wait how long to campaign at most; null for no end
   * @return the leadership, kept renewed
   * @throws WaitTimedOutException when {@code wait} ran out before this candidate was elected
   * @throws WaitCancelledException when the elector is closed (or the thread interrupted) first
   * @throws SQLException a server error that no retry can help, or an outage that outlasted {@code
   *     wait}
   */
  public Leadership campaign(String value, Duration wait) throws SQLException {
    long end = wait == null ? Long.MAX_VALUE : System.nanoTime() + wait.toNanos();
    int outages = 0;
    while (true) {
      checkOpen();
      long left = end == Long.MAX_VALUE ? Long.MAX_VALUE : Math.max(0, end - System.nanoTime());
      Duration chunk = Duration.ofNanos(Math.min(CAMPAIGN_WAIT.toNanos(), left));
      AtomicReference<Leadership> elected = new AtomicReference<>();
      LeaseListener user = options.keep().listener();
      KeepOptions keep =
          options
              .keep()
              .onLost(
                  (lease, reason) -> {
                    Leadership leadership = elected.get();
                    if (leadership != null) {
                      leadership.stopped(StopReason.lost(reason));
                    }
                    if (user != null) {
                      user.onLost(lease, reason);
                    }
                  });
      AcquireOptions opts = options.lease().owner(value).waitFor(chunk);
      KeptLease kept;
      Connection[] using = {null};
      try {
        kept = client.hold(key, opts, keep, campaigning(using));
      } catch (WaitTimedOutException timedOut) {
        checkOpen();
        if (System.nanoTime() - end >= 0) {
          throw timedOut;
        }
        continue;
      } catch (SQLException e) {
        checkOpen();
        boolean unreachable =
            e instanceof OutcomeUnknownException
                || e instanceof NoConnectionException
                || Sql.retryable(e);
        if (!unreachable || System.nanoTime() - end >= 0) {
          throw e;
        }
        // A restart or a failover outlasted the hold's retries (any grant it may have made was
        // released by its token): the campaign goes on, as a campaign must.
        try {
          Thread.sleep(client.backoffDelay(outages++).toMillis());
        } catch (InterruptedException interrupted) {
          Thread.currentThread().interrupt();
          throw new WaitCancelledException(key, e);
        }
        continue;
      } catch (java.util.concurrent.CancellationException e) {
        // Given up by close(): the hold released the token it sent, on the keeper's connections.
        checkOpen();
        throw e;
      }
      Leadership leadership = new Leadership(client, options, kept, value);
      elected.set(leadership);
      leaderships.add(leadership);
      if (closed) {
        leadership.cancelled();
        throw new WaitCancelledException(key, new SQLException("the elector was closed", "57014"));
      }
      leadership.started();
      return leadership;
    }
  }

  /** A consumer that tracks each try's connection in {@code busy}, for close() to cancel. */
  private Consumer<Connection> tracked(Connection[] current) {
    return conn -> {
      if (current[0] != null) {
        busy.remove(current[0]);
      }
      current[0] = conn;
      if (conn != null) {
        busy.add(conn);
        if (closed) {
          cancel(conn);
        }
      }
    };
  }

  /**
   * {@link #tracked}, for a campaign's tries: once the elector is closed no try follows (the hold
   * then releases the token it sent, in case a grant's reply was lost).
   */
  private Consumer<Connection> campaigning(Connection[] current) {
    Consumer<Connection> tracking = tracked(current);
    return conn -> {
      tracking.accept(conn);
      if (conn != null && closed) {
        throw new java.util.concurrent.CancellationException("the elector was closed");
      }
    };
  }

  private void checkOpen() throws WaitCancelledException {
    if (closed) {
      throw new WaitCancelledException(key, new SQLException("the elector was closed", "57014"));
    }
  }

  /**
   * The key's leader now.
   *
   * @return the leader (its value and fence); empty when nobody leads
   * @throws SQLException when the server could not be asked (after the client's retries)
   */
  public Optional<Leader> leader() throws SQLException {
    return client.leader(key);
  }

  /**
   * The key's leaders as they change; close the observer (or the elector) to stop it.
   *
   * @return a new observer, whose first {@link Observer#next()} gives the present leader
   */
  public Observer observe() {
    Observer observer = new Observer();
    observers.add(observer);
    return observer;
  }

  /**
   * The key's leaders as they change ({@code fence.await_change} in a loop): first the present, at
   * once (the leader, or empty when nobody leads), then every change: a new leader (a higher
   * fence), a new value proclaimed (the same fence), empty when nobody leads (a resign, a revoke,
   * an expiry, a session's end, a fast lease lost in a crash).
   */
  public final class Observer implements AutoCloseable {
    private Leader seen;
    private boolean seenAny;
    private boolean tellNext;
    private volatile boolean stopped;
    private final Connection[] using = {null};

    /**
     * The observer's own session, kept from one call of {@link #next()} to the next, as a session
     * the server paces: a new one per call would not notice a route that died under the one before.
     */
    private Connection conn; // by next()'s thread, or by close() when next() is not running

    private boolean inNext; // guarded by this

    private Observer() {}

    /**
     * Blocks until the next change and returns it; {@link WaitCancelledException} once the observer
     * or the elector is closed; {@link ObserverBlindException} when the server has not answered for
     * the lease's TTL (what was seen last may have expired meanwhile: the caller must not take it
     * as still true), after which the next call reconnects and goes on; a server error that no
     * retry can help otherwise.
     *
     * @return the leader after the change; empty when nobody leads
     * @throws WaitCancelledException once the observer or the elector is closed
     * @throws ObserverBlindException when the server has not answered for the lease's TTL
     * @throws SQLException a server error that no retry can help
     */
    public Optional<Leader> next() throws SQLException {
      long ttl = options.lease().ttl().toNanos();
      // The server asked to answer at least twice within a TTL, unchanged or not: each answer says
      // we can still see, so that only a silence as long as a lease can live means blindness.
      Duration ask = options.observeTimeout();
      if (ask.toNanos() > ttl / 2) {
        ask = Duration.ofNanos(ttl / 2);
      }
      long heard = System.nanoTime();
      int tries = 0;
      synchronized (this) {
        inNext = true;
      }
      try {
        while (true) {
          if (stopped || closed) {
            throw new WaitCancelledException(key, new SQLException("observer closed", "57014"));
          }
          long left = heard + ttl - System.nanoTime();
          Optional<Leader> now;
          try {
            if (left <= 0) {
              throw new SQLException("no answer within the TTL", "08006");
            }
            if (conn == null) {
              conn = client.dataSource().getConnection();
              tracked(using).accept(conn);
            }
            FenceClient.prepare(conn, Duration.ofNanos(left));
            // The first look (and the one after forget()) tells the present at once.
            now = PgFence.awaitChange(conn, key, seen, seenAny && !tellNext ? ask : Duration.ZERO);
            heard = System.nanoTime();
            tries = 0;
          } catch (SQLException e) {
            if (conn != null) {
              tracked(using).accept(null);
              FenceClient.abort(conn);
            }
            boolean connected = conn != null;
            conn = null;
            if (stopped || closed) {
              throw new WaitCancelledException(key, e);
            }
            if (connected && !Sql.retryable(e)) {
              throw e;
            }
            if (System.nanoTime() - (heard + ttl) >= 0) {
              throw new ObserverBlindException(key, e);
            }
            long pause =
                Math.min(client.backoffDelay(tries++).toNanos(), heard + ttl - System.nanoTime());
            try {
              java.util.concurrent.TimeUnit.NANOSECONDS.sleep(Math.max(0, pause));
            } catch (InterruptedException interrupted) {
              Thread.currentThread().interrupt();
              throw new WaitCancelledException(key, e);
            }
            continue;
          }
          Leader leader = now.orElse(null);
          if (seenAny && !tellNext && Objects.equals(leader, seen)) {
            continue; // no news: the timeout ran out
          }
          seenAny = true;
          tellNext = false;
          seen = leader;
          return now;
        }
      } finally {
        synchronized (this) {
          inNext = false;
          if (stopped || closed) {
            dropConnection();
          }
        }
      }
    }

    /**
     * Forgets what it saw: its next answer is the key's leader (or vacancy) as it is then, told
     * even when unchanged. For a caller that showed blindness instead of what it saw last.
     */
    public void forget() {
      seen = null;
      tellNext = true;
    }

    /** Gives the observer's connection back. */
    private void dropConnection() {
      if (conn != null) {
        tracked(using).accept(null);
        FenceClient.giveBack(conn);
        conn = null;
      }
    }

    @Override
    public void close() {
      stopped = true;
      observers.remove(this);
      Connection current = using[0];
      if (current != null) {
        cancel(current);
      }
      synchronized (this) {
        if (!inNext) {
          dropConnection();
        }
      }
    }
  }

  /**
   * onNewLeader's thread: observes until closed, again a second after a failure. After a blind
   * spell the next leader seen is told even if it is the one told before: the callback was told it
   * could not see.
   */
  private void watch() {
    while (!closed) {
      try {
        Observer observer = observe();
        while (!closed) {
          Optional<Leader> leader;
          try {
            leader = observer.next();
          } catch (ObserverBlindException blind) {
            if (options.onBlind() != null) {
              Callbacks.run(() -> options.onBlind().accept(blind));
            }
            observer.forget();
            continue;
          }
          Callbacks.run(() -> options.onNewLeader().accept(leader));
        }
      } catch (SQLException e) {
        try {
          Thread.sleep(1000);
        } catch (InterruptedException interrupted) {
          return;
        }
      }
    }
  }

  private static void cancel(Connection conn) {
    try {
      conn.unwrap(PGConnection.class).cancelQuery();
    } catch (SQLException ignored) {
      // Not running anything, or gone.
    }
  }

  /**
   * Cancels a campaign in progress and the observers, ends the leaderships (released, or left to
   * expire with {@code releaseOnCancel(false)}: {@code cancelled}).
   */
  @Override
  public void close() {
    closed = true;
    for (Connection conn : busy) {
      // The cancel ends a wait on the server (nothing is granted then); the abort ends a try whose
      // grant was made but whose reply cannot come (its token is then released by the keeper).
      cancel(conn);
      FenceClient.abort(conn);
    }
    for (Observer observer : observers) {
      observer.close();
    }
    for (Leadership leadership : leaderships) {
      if (leadership.isLeader()) {
        leadership.cancelled();
      }
    }
    if (watcher != null && watcher != Thread.currentThread()) {
      try {
        watcher.join(5000);
      } catch (InterruptedException interrupted) {
        Thread.currentThread().interrupt();
      }
    }
  }
}
