package io.pgfence;

import java.sql.Connection;
import java.sql.SQLException;
import java.sql.SQLTransientConnectionException;
import java.time.Duration;
import java.time.Instant;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Optional;
import java.util.OptionalLong;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executor;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;
import javax.sql.DataSource;

/**
 * The lease calls over a {@link DataSource} (a pool such as HikariCP, or the driver's own), each in
 * a transaction of its own on a connection it takes and gives back, retried with backoff (full
 * jitter) when the connection breaks: safe for each of them. An acquire carries the token drawn
 * once before its first try, so a retry after a lost reply gets the lease that reply granted; renew
 * and release are idempotent. When the retries run out after a try that may have taken effect, the
 * call ends in {@link OutcomeUnknownException}, which carries an acquire's token. Fenced writes are
 * not retried: only the caller knows whether a write may happen twice.
 *
 * <p>{@link #hold} keeps a lease renewed in the background: see {@link KeptLease}. The client's
 * keeper renews all its kept leases over a few connections of its own (2 by default), from the
 * keeper's DataSource: give it one outside the application's pool ({@link #FenceClient(DataSource,
 * DataSource, int)}), so that a busy pool cannot starve a renewal.
 */
public final class FenceClient implements AutoCloseable {
  /** Runs the driver's network-timeout work on the caller's thread (the driver needs none). */
  static final Executor DIRECT = Runnable::run;

  private final DataSource dataSource;
  private final Backoff backoff;
  private final Duration callTimeout;
  private final ScheduledThreadPoolExecutor timers;
  private final DataSource keeperSource;
  private final int keeperConnections;
  private Keeper keeper; // guarded by this; made with the first kept lease
  private final Observers observers = new Observers();

  /** The keeper's connections when not told otherwise. */
  public static final int KEEPER_CONNECTIONS = 2;

  /**
   * A client with {@link Backoff#defaults()} and a 30 s bound on each try, whose keeper opens its 2
   * connections from {@code dataSource} too (and keeps them while it keeps leases): with a pool,
   * prefer {@link #FenceClient(DataSource, DataSource, int)}.
   *
   * @param dataSource where the calls' and the keeper's connections come from
   */
  public FenceClient(DataSource dataSource) {
    this(dataSource, Backoff.defaults(), Duration.ofSeconds(30));
  }

  /**
   * A client whose calls go to {@code dataSource} (the application's pool) and whose keeper renews
   * every kept lease over at most {@code keeperConnections} connections of its own, opened from
   * {@code keeperSource} (a DataSource of plain connections to the same server, not the pool).
   *
   * @param dataSource where the calls' connections come from (the application's pool)
   * @param keeperSource where the keeper's connections come from: the same server, outside the pool
   * @param keeperConnections how many connections the keeper opens at most (1 or more)
   * @throws IllegalArgumentException when {@code keeperConnections} is below 1
   */
  public FenceClient(DataSource dataSource, DataSource keeperSource, int keeperConnections) {
    this(dataSource, keeperSource, keeperConnections, Backoff.defaults(), Duration.ofSeconds(30));
  }

  /**
   * @param dataSource where connections come from
   * @param backoff how failed tries are retried
   * @param callTimeout bounds each try (beyond an acquire's wait): a server that hangs (stopped, or
   *     a dead route) must not hang the caller
   */
  public FenceClient(DataSource dataSource, Backoff backoff, Duration callTimeout) {
    this(dataSource, dataSource, KEEPER_CONNECTIONS, backoff, callTimeout);
  }

  /**
   * @param dataSource where the calls' connections come from
   * @param keeperSource where the keeper's connections come from
   * @param keeperConnections how many connections the keeper opens at most (1 or more)
   * @param backoff how failed tries are retried
   * @param callTimeout bounds each try (beyond an acquire's wait)
   */
  public FenceClient(
      DataSource dataSource,
      DataSource keeperSource,
      int keeperConnections,
      Backoff backoff,
      Duration callTimeout) {
    if (keeperConnections < 1) {
      throw new IllegalArgumentException("keeperConnections must be 1 or more");
    }
    this.keeperSource = Objects.requireNonNull(keeperSource);
    this.keeperConnections = keeperConnections;
    this.dataSource = Objects.requireNonNull(dataSource);
    this.backoff = Objects.requireNonNull(backoff);
    this.callTimeout = Objects.requireNonNull(callTimeout);
    this.timers =
        new ScheduledThreadPoolExecutor(
            1,
            runnable -> {
              Thread thread = new Thread(runnable, "pg-fence-deadlines");
              thread.setDaemon(true);
              return thread;
            });
    this.timers.setRemoveOnCancelPolicy(true);
  }

  /**
   * The DataSource the calls take their connections from.
   *
   * @return the DataSource given to the constructor for the calls
   */
  public DataSource dataSource() {
    return dataSource;
  }

  /**
   * Tells {@code observer} of this client's acquires, renewals, kept leases, losses and leaderships
   * from now on (see {@link FenceObserver}); adding one twice adds it once.
   *
   * @param observer told of what the client does, on the client's threads
   */
  public void addObserver(FenceObserver observer) {
    observers.add(Objects.requireNonNull(observer));
  }

  /**
   * Stops telling {@code observer}.
   *
   * @param observer an observer added before
   * @return whether it had been added
   */
  public boolean removeObserver(FenceObserver observer) {
    return observers.remove(observer);
  }

  /** The observers, told as one. */
  Observers observers() {
    return observers;
  }

  ScheduledThreadPoolExecutor timers() {
    return timers;
  }

  /**
   * Before a kept lease's acquire, when the keeper takes its connections from the application's
   * pool (no keeper DataSource): it takes them now, before the grant, and holds them while it keeps
   * any lease, so that a pool hogged later starves no renewal. A keeper DataSource of its own is
   * opened from when a renewal needs it.
   */
  private void reserveKeeper() {
    if (keeperSource == dataSource) {
      keeper().reserve();
    }
  }

  /** The client's keeper, started with its first kept lease. */
  synchronized Keeper keeper() {
    if (keeper == null) {
      keeper = new Keeper(this, keeperSource, keeperConnections);
    }
    return keeper;
  }

  /** The keeper's stats; null before its first kept lease. */
  synchronized Keeper.Stats keeperStats() {
    return keeper == null ? null : keeper.stats();
  }

  /** The backoff's delay before retry {@code attempt} (0 first). */
  Duration backoffDelay(int attempt) {
    return backoff.delay(attempt);
  }

  /** One try of a call, on a connection in autocommit. */
  @FunctionalInterface
  interface Call<T> {
    T run(Connection conn) throws SQLException;
  }

  /**
   * How a call is retried. The backoff's {@code maxElapsed} counts from the call's first failure,
   * or with {@code inAll} from its start (a call that must end within it, waits included).
   */
  record Retry(
      Backoff backoff,
      Duration timeout,
      boolean resend,
      UUID token,
      boolean keep,
      Consumer<Connection> using,
      boolean inAll) {
    Retry(Backoff backoff, Duration timeout, boolean resend, UUID token, boolean keep) {
      this(backoff, timeout, resend, token, keep, null, false);
    }

    /** This retry, telling {@code using} of each try's connection (and null after it). */
    Retry using(Consumer<Connection> using) {
      return new Retry(backoff, timeout, resend, token, keep, using, inAll);
    }
  }

  /** Retried within {@code bound} in all, each try bounded by it too. */
  private Retry bounded(Duration bound) {
    Backoff within = new Backoff(backoff.base(), backoff.cap(), backoff.maxAttempts(), bound);
    return new Retry(within, bound, true, null, false, null, true);
  }

  private Retry plain(Duration extra) {
    return new Retry(backoff, callTimeout.plus(extra), true, null, false);
  }

  /**
   * Runs {@code call} until it succeeds, fails on the server's word, or the retries run out. With
   * {@code keep}, the connection of the try that succeeded is not given back (the call keeps it).
   */
  <T> T retrying(Retry retry, Call<T> call) throws SQLException {
    // The retries' time counts from the first failure, not from the call: an acquire that waited
    // its wait before its session ended still has all of maxElapsed to retry.
    long started = System.nanoTime();
    boolean counting = retry.inAll();
    int tries = 0;
    boolean connected = false;
    // Once one try may have taken effect, running out of retries leaves the outcome unknown.
    boolean maybeDone = false;
    while (true) {
      SQLException error;
      Connection conn = null;
      try {
        conn = dataSource.getConnection();
        connected = true;
        if (retry.using() != null) {
          retry.using().accept(conn);
        }
        prepare(conn, retry.timeout());
        T result = call.run(conn);
        if (retry.using() != null) {
          retry.using().accept(null);
        }
        if (!retry.keep()) {
          giveBack(conn);
        }
        return result;
      } catch (SQLException e) {
        if (conn != null && !Sql.retryable(e)) {
          if (retry.using() != null) {
            retry.using().accept(null);
          }
          giveBack(conn);
          throw e;
        }
        error = e;
        if (conn != null) {
          maybeDone |= Sql.mayHaveTakenEffect(e);
          abort(conn);
        }
      } catch (RuntimeException e) {
        if (conn != null) {
          abort(conn);
        }
        throw e;
      }
      if (retry.using() != null) {
        retry.using().accept(null);
      }
      tries++;
      if (!counting) {
        started = System.nanoTime();
        counting = true;
      }
      Duration delay = maybeDone && !retry.resend() ? null : retry.backoff().next(tries, started);
      if (delay != null) {
        try {
          Thread.sleep(delay.toMillis(), delay.toNanosPart() % 1_000_000);
          continue;
        } catch (InterruptedException interrupted) {
          Thread.currentThread().interrupt();
        }
      }
      if (maybeDone) {
        throw new OutcomeUnknownException(
            "outcome unknown: the connection failed mid-call and retries ran out",
            retry.token(),
            error);
      }
      throw connected ? error : new NoConnectionException(error);
    }
  }

  /** Autocommit (each call is its own transaction) and a bound on every read. */
  static void prepare(Connection conn, Duration timeout) throws SQLException {
    if (!conn.getAutoCommit()) {
      conn.setAutoCommit(true);
    }
    conn.setNetworkTimeout(DIRECT, (int) Math.min(Integer.MAX_VALUE, timeout.toMillis() + 1));
  }

  /** Gives a connection back to the DataSource, with no network timeout. */
  static void giveBack(Connection conn) {
    try {
      conn.setNetworkTimeout(DIRECT, 0);
    } catch (SQLException ignored) {
      // It is closed either way.
    }
    closeQuietly(conn);
  }

  /** Ends a connection that broke or hung: the pool must not hand it out again. */
  static void abort(Connection conn) {
    try {
      conn.abort(DIRECT);
    } catch (SQLException | RuntimeException ignored) {
      closeQuietly(conn);
    }
  }

  static void closeQuietly(Connection conn) {
    try {
      conn.close();
    } catch (SQLException ignored) {
      // Nothing more to do.
    }
  }

  /**
   * {@link PgFence#acquire}, retried: the lease, or empty when the key is held (or the wait ran
   * out). The token (the options' own, or one drawn now) is the same on every try; {@link
   * OutcomeUnknownException#token()} carries it.
   *
   * @param key the key, 1 to 512 bytes in UTF-8
   * @param opts the lease's ttl and the rest
   * @return the lease; empty when the key is held or the wait ran out
   * @throws IllegalArgumentException for options that cannot work together, before anything is sent
   * @throws WaitCancelledException when the wait was cancelled on the server (nothing granted)
   * @throws OutcomeUnknownException when the retries ran out after a try that may have taken effect
   * @throws SQLException a server error that no retry can help (22023 for an argument it refuses,
   *     25006 on a standby), or {@link NoConnectionException} when no connection could be had
   *     before the retries ran out (nothing was sent)
   */
  public Optional<Lease> acquire(String key, AcquireOptions opts) throws SQLException {
    opts.check();
    AcquireOptions tokened = opts.withToken();
    return acquire(key, tokened, callTimeout);
  }

  Optional<Lease> acquire(String key, AcquireOptions opts, Duration timeout) throws SQLException {
    return acquire(key, opts, timeout, null);
  }

  Optional<Lease> acquire(
      String key, AcquireOptions opts, Duration timeout, Consumer<Connection> using)
      throws SQLException {
    Retry retry =
        new Retry(backoff, timeout.plus(opts.waitTime()), true, opts.token().get(), false)
            .using(using);
    return observed(() -> retrying(retry, conn -> PgFence.acquire(conn, key, opts)));
  }

  /** An acquire with its retries. */
  @FunctionalInterface
  private interface Acquire<T> {
    Optional<T> run() throws SQLException;
  }

  /** An acquire, told to the observers with its time and outcome. */
  private <T> Optional<T> observed(Acquire<T> acquire) throws SQLException {
    if (!observers.any()) {
      return acquire.run();
    }
    long started = System.nanoTime();
    FenceObserver.AcquireOutcome outcome = FenceObserver.AcquireOutcome.ERROR;
    try {
      Optional<T> granted = acquire.run();
      outcome =
          granted.isPresent()
              ? FenceObserver.AcquireOutcome.GRANTED
              : FenceObserver.AcquireOutcome.REFUSED;
      return granted;
    } finally {
      observers.acquireFinished(Duration.ofNanos(System.nanoTime() - started), outcome);
    }
  }

  /** A session-bound lease and the connection it is bound to (kept open, for the keeper). */
  record Bound(Lease lease, Connection conn) {}

  /**
   * {@link PgFence#acquire} of a session-bound lease, retried, with the connection it is bound to.
   * A session-bound lease lives with the backend that took it: after a try whose outcome is unknown
   * (its connection broke on this side only while its backend lives on), a retry with that token
   * would get a lease bound to the orphaned backend. So each retry first releases the previous
   * try's token, then asks with a fresh one, and the grant is checked to be bound to the session it
   * came on.
   */
  Optional<Bound> acquireSessionBound(
      String key, AcquireOptions opts, Duration timeout, Consumer<Connection> using)
      throws SQLException {
    UUID[] tokens = {opts.token().orElse(null), null}; // the caller's; an unsure try's
    Retry retry =
        new Retry(backoff, timeout.plus(opts.waitTime()), true, opts.token().orElse(null), true)
            .using(using);
    return observed(
        () ->
            retrying(
                retry,
                conn -> {
                  if (tokens[1] != null) {
                    PgFence.release(conn, key, tokens[1]);
                  }
                  UUID token = tokens[0] != null ? tokens[0] : UUID.randomUUID();
                  tokens[0] = null;
                  tokens[1] = token;
                  Optional<Lease> granted = PgFence.acquire(conn, key, opts.token(token));
                  if (granted.isPresent() && !PgFence.boundHere(conn, key, granted.get().fence())) {
                    // The token was already another session's: left unsure, released by the next
                    // try.
                    throw new SQLTransientConnectionException(
                        "granted to another session", "08000");
                  }
                  tokens[1] = null;
                  if (granted.isEmpty()) {
                    giveBack(conn);
                    return Optional.empty();
                  }
                  return Optional.of(new Bound(granted.get(), conn));
                }));
  }

  /**
   * {@link PgFence#renew}, retried; {@link LeaseLostException} with the reason {@code lease_status}
   * gives.
   *
   * @param lease the lease to renew (its key and token)
   * @param ttl the new time to live from now, above zero and at most {@code pg_fence.max_ttl}
   * @return the server's new expiry of the lease
   * @throws LeaseLostException with the reason, when the token no longer holds the key's live lease
   * @throws SQLException a server error that no retry can help (22023 for an argument it refuses,
   *     25006 on a standby), or {@link NoConnectionException} when no connection could be had
   *     before the retries ran out (nothing was sent)
   */
  public Instant renew(Lease lease, Duration ttl) throws SQLException {
    try {
      return retrying(plain(Duration.ZERO), conn -> PgFence.renew(conn, lease, ttl));
    } catch (LeaseLostException lost) {
      throw explained(lost, List.of(lease.key()), lease.token(), lease.durable());
    }
  }

  /** {@code lost} with the reason the server gives (one more statement, bounded). */
  private LeaseLostException explained(
      LeaseLostException lost, List<String> keys, UUID token, boolean durable) {
    LossReason reason = lossReason(keys, token, durable, callTimeout);
    return new LeaseLostException(lost.key(), reason, lost.getCause());
  }

  /**
   * Why the leases {@code token} was granted on {@code keys} ended, by lease_status; {@link
   * LossReason#UNKNOWN} for a lease released by someone with its token; null while live or with no
   * answer within {@code bound}.
   */
  LossReason lossReason(List<String> keys, UUID token, boolean durable, Duration bound) {
    return lossReason(keys, token, durable, bounded(bound));
  }

  /** {@link #lossReason(List, UUID, boolean, Duration)} in one try, bounded by {@code bound}. */
  LossReason lossReasonOnce(List<String> keys, UUID token, boolean durable, Duration bound) {
    Retry once = new Retry(new Backoff(bound, bound, 1, bound), bound, false, null, false);
    return lossReason(keys, token, durable, once);
  }

  private LossReason lossReason(List<String> keys, UUID token, boolean durable, Retry retry) {
    try {
      String ended = retrying(retry, conn -> PgFence.firstEnded(conn, keys, token));
      if (ended == null) {
        return null;
      }
      LossReason reason = LossReason.ofStatus(ended, durable);
      return reason == null ? LossReason.UNKNOWN : reason;
    } catch (SQLException e) {
      return null;
    }
  }

  /**
   * The server's word on the first of the leases {@code token} was granted on {@code keys} that
   * ended (null: all live), retried within {@code bound}.
   */
  String endedBy(List<String> keys, UUID token, Duration bound) throws SQLException {
    return retrying(bounded(bound), conn -> PgFence.firstEnded(conn, keys, token));
  }

  /**
   * {@link PgFence#release}, retried: true when this call ended the lease.
   *
   * @param lease the lease to end (its key and token)
   * @return true when this call ended the lease; false when the token held nothing (already ended,
   *     or ended by an earlier try whose reply was lost)
   * @throws SQLException a server error that no retry can help (22023 for an argument it refuses,
   *     25006 on a standby), or {@link NoConnectionException} when no connection could be had
   *     before the retries ran out (nothing was sent)
   */
  public boolean release(Lease lease) throws SQLException {
    return releaseToken(lease.key(), lease.token());
  }

  /**
   * Releases by the token alone: for a lease whose grant may have happened but was never seen (the
   * token of an {@link OutcomeUnknownException}).
   *
   * @param key the key the token was sent for
   * @param token the token the lease was (or may have been) granted with
   * @return true when this call ended a lease; false when the token held nothing
   * @throws SQLException a server error that no retry can help (22023 for an argument it refuses,
   *     25006 on a standby), or {@link NoConnectionException} when no connection could be had
   *     before the retries ran out (nothing was sent)
   */
  public boolean releaseToken(String key, UUID token) throws SQLException {
    return retrying(plain(Duration.ZERO), conn -> PgFence.release(conn, key, token));
  }

  /** {@link #releaseToken}, bounded by {@code bound} in all. */
  boolean releaseToken(String key, UUID token, Duration bound) throws SQLException {
    return retrying(bounded(bound), conn -> PgFence.release(conn, key, token));
  }

  /**
   * {@link PgFence#acquireAll}, retried only while no try can have been granted: it takes no token,
   * so a try whose reply was lost cannot be asked again for the set it may have granted. Such a try
   * ends it with {@link OutcomeUnknownException}; the set, if granted, ends at its TTL.
   *
   * @param keys the keys, each 1 to 512 bytes in UTF-8; their order does not matter
   * @param opts the leases' ttl, owner, wait, session_bound and durable; no token, shared, permits
   *     or lock-delay
   * @return the set; empty when a key is held and the wait ran out
   * @throws IllegalArgumentException for options a set cannot take, before anything is sent
   * @throws WaitCancelledException when the wait was cancelled on the server (nothing granted)
   * @throws OutcomeUnknownException when a try that may have been granted got no reply
   * @throws SQLException a server error that no retry can help (22023 for an argument it refuses,
   *     25006 on a standby), or {@link NoConnectionException} when no connection could be had
   *     before the retries ran out (nothing was sent)
   */
  public Optional<LeaseSet> acquireAll(Collection<String> keys, AcquireOptions opts)
      throws SQLException {
    opts.checkForSet();
    Retry retry = new Retry(backoff, callTimeout.plus(opts.waitTime()), false, null, false);
    return observed(() -> retrying(retry, conn -> PgFence.acquireAll(conn, keys, opts)));
  }

  /**
   * {@link PgFence#renewAll}, retried; {@link LeaseLostException} with its reason.
   *
   * @param set the set to renew (its keys and token)
   * @param ttl the new time to live from now, above zero and at most {@code pg_fence.max_ttl}
   * @return the earliest of the server's new expiries
   * @throws LeaseLostException with the reason, when the token no longer holds one of the leases
   *     (then none is renewed)
   * @throws SQLException a server error that no retry can help (22023 for an argument it refuses,
   *     25006 on a standby), or {@link NoConnectionException} when no connection could be had
   *     before the retries ran out (nothing was sent)
   */
  public Instant renewAll(LeaseSet set, Duration ttl) throws SQLException {
    try {
      return retrying(plain(Duration.ZERO), conn -> PgFence.renewAll(conn, set, ttl));
    } catch (LeaseLostException lost) {
      throw explained(lost, set.keys(), set.token(), set.leases().get(0).durable());
    }
  }

  /**
   * {@link PgFence#releaseAll}, retried.
   *
   * @param set the set to end (its keys and token)
   * @return how many leases this call ended: 0 to the set's size (an earlier try whose reply was
   *     lost may have ended them)
   * @throws SQLException a server error that no retry can help (22023 for an argument it refuses,
   *     25006 on a standby), or {@link NoConnectionException} when no connection could be had
   *     before the retries ran out (nothing was sent)
   */
  public int releaseAll(LeaseSet set) throws SQLException {
    return retrying(plain(Duration.ZERO), conn -> PgFence.releaseAll(conn, set));
  }

  int releaseAll(LeaseSet set, Duration bound) throws SQLException {
    return retrying(bounded(bound), conn -> PgFence.releaseAll(conn, set));
  }

  /**
   * {@link PgFence#status}, retried.
   *
   * @param key the lease's key
   * @param token the token the lease was (or may have been) granted with
   * @return the status: live, or why it ended
   * @throws SQLException a server error that no retry can help, or {@link NoConnectionException}
   *     when no connection could be had before the retries ran out
   */
  public LeaseStatus status(String key, UUID token) throws SQLException {
    return retrying(plain(Duration.ZERO), conn -> PgFence.status(conn, key, token));
  }

  /**
   * {@link PgFence#currentFence}, retried.
   *
   * @param key the key
   * @return the key's highest fence, live or not; empty when the server has no row for the key
   * @throws SQLException a server error that no retry can help, or {@link NoConnectionException}
   *     when no connection could be had before the retries ran out
   */
  public OptionalLong currentFence(String key) throws SQLException {
    return retrying(plain(Duration.ZERO), conn -> PgFence.currentFence(conn, key));
  }

  /**
   * {@link PgFence#awaitChange}, retried; each try waits {@code timeout} at most.
   *
   * @param key the key to watch
   * @param seen the leader seen last; null for nobody leading (or nothing seen yet)
   * @param timeout how long one try waits for a change at most; zero to ask without waiting
   * @return the key's leader; empty when nobody leads
   * @throws SQLException a server error that no retry can help, or {@link NoConnectionException}
   *     when no connection could be had before the retries ran out
   */
  public Optional<Leader> awaitChange(String key, Leader seen, Duration timeout)
      throws SQLException {
    return retrying(plain(timeout), conn -> PgFence.awaitChange(conn, key, seen, timeout));
  }

  Optional<Leader> awaitChange(
      String key, Leader seen, Duration timeout, Consumer<Connection> using) throws SQLException {
    return retrying(
        plain(timeout).using(using), conn -> PgFence.awaitChange(conn, key, seen, timeout));
  }

  /**
   * {@link PgFence#proclaim}, retried (a proclaim done twice is done once).
   *
   * @param lease the live lease (its key and token)
   * @param owner the new owner, at most 256 bytes in UTF-8; empty for the session's
   *     application_name
   * @return true when changed; false, changing nothing, when the token no longer holds the lease
   * @throws SQLException a server error that no retry can help (22023 for an argument it refuses,
   *     25006 on a standby), or {@link NoConnectionException} when no connection could be had
   *     before the retries ran out (nothing was sent)
   */
  public boolean proclaim(Lease lease, String owner) throws SQLException {
    return retrying(plain(Duration.ZERO), conn -> PgFence.proclaim(conn, lease, owner));
  }

  /**
   * {@link PgFence#handoff}, retried: a retry after a hand-off whose answer was lost finds the
   * token holding nothing and returns empty; {@link #status} then says {@code released}.
   *
   * @param lease the lease to end (its key and token)
   * @param toOwner the owner the waiting acquirer asked with, 1 to 256 bytes in UTF-8
   * @return the new leader; empty when nobody took it, or when a lost reply's hand-off happened
   * @throws SQLException a server error that no retry can help (22023 for an argument it refuses,
   *     25006 on a standby), or {@link NoConnectionException} when no connection could be had
   *     before the retries ran out (nothing was sent)
   */
  public Optional<Leader> handoff(Lease lease, String toOwner) throws SQLException {
    return retrying(plain(Duration.ZERO), conn -> PgFence.handoff(conn, lease, toOwner));
  }

  /**
   * The key's leader now.
   *
   * @param key the elected key
   * @return the leader; empty when nobody leads
   * @throws SQLException a server error that no retry can help, or {@link NoConnectionException}
   *     when no connection could be had before the retries ran out
   */
  public Optional<Leader> leader(String key) throws SQLException {
    return awaitChange(key, null, Duration.ZERO);
  }

  /**
   * {@link PgFence#fencedUpdate} in a transaction of its own, not retried: after a broken
   * connection its outcome is unknown, and only the caller can tell whether doing it twice is
   * harmless.
   *
   * @param key the lease's key
   * @param fence the lease's fence, as granted
   * @param table the table to update, as SQL names it ({@code "billing.invoices"})
   * @param changes the new values by column name, sent as a JSON object; not empty
   * @param filter the rows to update: column name to the value it must equal (all of them); not
   *     empty, no null value
   * @return the number of rows updated; 0 when none matched
   * @throws StaleFenceException when {@code fence} is not the key's live fence: nothing was written
   * @throws SQLException the server's, for a bad table, column or value, or the driver's when the
   *     connection broke (then whether it was written is unknown)
   */
  public long fencedUpdate(
      String key, long fence, String table, Map<String, ?> changes, Map<String, ?> filter)
      throws SQLException {
    Retry once =
        new Retry(
            new Backoff(Duration.ZERO, Duration.ZERO, 1, callTimeout),
            callTimeout,
            false,
            null,
            false);
    return retrying(once, conn -> PgFence.fencedUpdate(conn, key, fence, table, changes, filter));
  }

  /**
   * {@link #hold(String, AcquireOptions, KeepOptions)} with {@link KeepOptions#defaults()}.
   *
   * @param key the key, 1 to 512 bytes in UTF-8
   * @param opts the lease's ttl and the rest
   * @return the kept lease, renewed in the background until released or lost
   * @throws WaitTimedOutException when the key was not granted within the options' wait
   * @throws OutcomeUnknownException when the retries ran out after a try that may have been granted
   *     (its token is then released in the background)
   * @throws SQLException a server error that no retry can help (22023 for an argument it refuses,
   *     25006 on a standby), or {@link NoConnectionException} when no connection could be had
   *     before the retries ran out (nothing was sent)
   */
  public KeptLease hold(String key, AcquireOptions opts) throws SQLException {
    return hold(key, opts, KeepOptions.defaults());
  }

  /**
   * Acquires {@code key} (waiting up to the options' wait; {@link WaitTimedOutException} when not
   * granted) and keeps it: the client's keeper renews it every {@code renewEvery} (ttl/3) with its
   * other kept leases over the keeper's connections (a session-bound lease on the connection it was
   * granted on), retrying failed renewals with backoff, and the lease is declared lost the moment
   * the server says so, or {@code unknown} ({@link LossReason#UNREACHABLE}) when the local deadline
   * passes without a renewal, even while a renewal hangs.
   *
   * @param key the key, 1 to 512 bytes in UTF-8
   * @param opts the lease's ttl and the rest
   * @param keep how the lease is kept: renewal period, margin, backoff, bound, listener
   * @return the kept lease, renewed in the background until released or lost
   * @throws IllegalArgumentException for options that cannot work together, or a renewal period
   *     that leaves no time to renew, before anything is sent
   * @throws WaitTimedOutException when the key was not granted within the options' wait
   * @throws OutcomeUnknownException when the retries ran out after a try that may have been granted
   *     (its token is then released in the background)
   * @throws SQLException a server error that no retry can help (22023 for an argument it refuses,
   *     25006 on a standby), or {@link NoConnectionException} when no connection could be had
   *     before the retries ran out (nothing was sent)
   */
  public KeptLease hold(String key, AcquireOptions opts, KeepOptions keep) throws SQLException {
    return hold(key, opts, keep, null);
  }

  /**
   * {@link #hold(String, AcquireOptions, KeepOptions)}, telling {@code using} of each try's
   * connection.
   */
  KeptLease hold(String key, AcquireOptions opts, KeepOptions keep, Consumer<Connection> using)
      throws SQLException {
    opts.check();
    AcquireOptions tokened = opts.withToken();
    Timing timing = Timing.of(opts, keep);
    // Taken before the first try: whichever try granted the lease was sent after it.
    long sent = System.nanoTime();
    Lease lease;
    Connection bound = null;
    if (opts.isSessionBound()) {
      Optional<Bound> granted = acquireSessionBound(key, tokened, keep.timeout(), using);
      if (granted.isEmpty()) {
        throw new WaitTimedOutException(key);
      }
      lease = granted.get().lease();
      bound = granted.get().conn();
    } else {
      reserveKeeper();
      Optional<Lease> granted;
      try {
        granted = acquire(key, tokened, keep.timeout(), using);
      } catch (SQLException | RuntimeException e) {
        if (e instanceof OutcomeUnknownException
            || e instanceof java.util.concurrent.CancellationException
            || (e instanceof SQLException sql && Sql.mayHaveTakenEffect(sql))) {
          // Granted, perhaps, with a reply that never came: nobody else knows the token.
          keeper().releaseToken(key, tokened.token().get(), opts.ttl());
        }
        throw e;
      }
      lease = granted.orElseThrow(() -> new WaitTimedOutException(key));
    }
    KeptLease kept =
        new KeptLease(
            this, lease, keep, opts.ttl(), timing.span(), timing.every(), sent, bound, null);
    kept.start();
    return kept;
  }

  /**
   * {@link #hold(String, AcquireOptions, KeepOptions)} with its answers as results: the kept lease,
   * or empty when the key was not free within the options' wait, and empty at once, waiting for
   * nothing, when this thread already keeps a lease of the key here (it would wait for itself).
   *
   * @param key the key, 1 to 512 bytes in UTF-8
   * @param opts the lease's ttl and the rest
   * @param keep how the lease is kept: renewal period, margin, backoff, bound, listener
   * @return the kept lease; empty when the key was not free within the wait, or is kept by this
   *     thread already
   * @throws IllegalArgumentException for options that cannot work together, or a renewal period
   *     that leaves no time to renew, before anything is sent
   * @throws OutcomeUnknownException when the retries ran out after a try that may have been granted
   *     (its token is then released in the background)
   * @throws SQLException a server error that no retry can help (22023 for an argument it refuses,
   *     25006 on a standby), or {@link NoConnectionException} when no connection could be had
   *     before the retries ran out (nothing was sent)
   */
  public Optional<KeptLease> tryHold(String key, AcquireOptions opts, KeepOptions keep)
      throws SQLException {
    synchronized (this) {
      if (keeper != null && keeper.heldBy(key, Thread.currentThread())) {
        return Optional.empty();
      }
    }
    try {
      return Optional.of(hold(key, opts, keep));
    } catch (WaitTimedOutException notFree) {
      return Optional.empty();
    }
  }

  /**
   * {@link #hold(String, AcquireOptions, KeepOptions)} on a thread of its own, for a caller that
   * may give up: cancelling the future (or its completing otherwise first, as {@link
   * CompletableFuture#orTimeout} does) abandons the acquire with its connection, and the token it
   * sent is released on the keeper's connections (retried until done or the TTL has passed), so
   * that a grant whose reply never came is not left behind. A lease granted after the caller gave
   * up is released the same way.
   *
   * @param key the key, 1 to 512 bytes in UTF-8
   * @param opts the lease's ttl and the rest
   * @param keep how the lease is kept: renewal period, margin, backoff, bound, listener
   * @return the future of the kept lease, completed exceptionally with what {@link #hold} would
   *     throw
   * @throws IllegalArgumentException for options that cannot work together, before the thread
   *     starts
   */
  public CompletableFuture<KeptLease> holdAsync(String key, AcquireOptions opts, KeepOptions keep) {
    opts.check();
    AcquireOptions tokened = opts.withToken();
    CompletableFuture<KeptLease> future = new CompletableFuture<>();
    GiveUp giveUp = new GiveUp();
    Thread thread =
        new Thread(
            () -> {
              KeptLease kept;
              try {
                kept = hold(key, tokened, keep, giveUp);
              } catch (SQLException | RuntimeException e) {
                // The server's answer (not granted, an error) or the hold's own release after a
                // give-up: nothing more to release.
                giveUp.finish();
                future.completeExceptionally(e);
                return;
              }
              if (!giveUp.finish() || !future.complete(kept)) {
                kept.abandon(KeptLease.State.RELEASED);
                keeper().releaseToken(key, kept.token(), opts.ttl());
              }
            },
            "pg-fence-hold " + key);
    thread.setDaemon(true);
    thread.start();
    future.whenComplete(
        (kept, error) -> {
          if (error != null && giveUp.giveUp()) {
            keeper().releaseToken(key, tokened.token().get(), opts.ttl());
          }
        });
    return future;
  }

  /**
   * A caller's giving up, for a call's tries: the try in flight is aborted with its connection, and
   * no try follows.
   */
  private static final class GiveUp implements Consumer<Connection> {
    private Connection current; // guarded by this
    private boolean givenUp; // guarded by this
    private boolean finished; // guarded by this

    @Override
    public void accept(Connection conn) {
      synchronized (this) {
        if (givenUp && conn != null) {
          throw new java.util.concurrent.CancellationException("the caller gave up");
        }
        current = conn;
      }
    }

    /** The call ended before any give-up: true, and a later give-up does nothing. */
    synchronized boolean finish() {
      if (givenUp) {
        return false;
      }
      finished = true;
      return true;
    }

    /** True the first time, while the call runs: the try in flight is aborted. */
    boolean giveUp() {
      Connection conn;
      synchronized (this) {
        if (givenUp || finished) {
          return false;
        }
        givenUp = true;
        conn = current;
      }
      if (conn != null) {
        abort(conn);
      }
      return true;
    }
  }

  /**
   * Takes the first free key of {@code keys}, in their order (as SKIP LOCKED does for rows: a held
   * key is passed over, never waited for), in one round trip ({@code fence.lease_acquire_any}), and
   * keeps it as {@link #hold} does; empty when none is free. The options' wait, {@code shared},
   * {@code permits} and {@code lockDelay} do not apply (an {@link IllegalArgumentException}), nor
   * does {@code sessionBound}: hold a session-bound lease by its key.
   *
   * @param keys the keys to try, in the order to try them; each 1 to 512 bytes in UTF-8
   * @param opts the lease's ttl, owner, durable and token
   * @param keep how the lease is kept: renewal period, margin, backoff, bound, listener
   * @return the kept lease of the first free key; empty when every key is held
   * @throws IllegalArgumentException for a wait, a lock-delay, a shared, permits or session-bound
   *     lease, or a renewal period that leaves no time to renew, before anything is sent
   * @throws OutcomeUnknownException when the retries ran out after a try that may have been granted
   *     (its token is then released in the background)
   * @throws SQLException a server error that no retry can help (22023 for an argument it refuses,
   *     25006 on a standby), or {@link NoConnectionException} when no connection could be had
   *     before the retries ran out (nothing was sent)
   */
  public Optional<KeptLease> holdFirstFree(List<String> keys, AcquireOptions opts, KeepOptions keep)
      throws SQLException {
    opts.check();
    if (opts.isSessionBound() || opts.isShared() || opts.permits() != 1) {
      throw new IllegalArgumentException(
          "holdFirstFree takes exclusive leases that are not session-bound");
    }
    if (!opts.waitTime().isZero() || !opts.lockDelay().isZero()) {
      throw new IllegalArgumentException("holdFirstFree never waits, and takes no lock delay");
    }
    AcquireOptions tokened = opts.withToken();
    Timing timing = Timing.of(opts, keep);
    reserveKeeper();
    long sent = System.nanoTime();
    Optional<Lease> granted;
    try {
      Retry retry = new Retry(backoff, keep.timeout(), true, tokened.token().get(), false);
      granted = observed(() -> retrying(retry, conn -> PgFence.acquireAny(conn, keys, tokened)));
    } catch (OutcomeUnknownException e) {
      for (String key : keys) {
        keeper().releaseToken(key, tokened.token().get(), opts.ttl());
      }
      throw e;
    }
    if (granted.isEmpty()) {
      return Optional.empty();
    }
    KeptLease kept =
        new KeptLease(
            this, granted.get(), keep, opts.ttl(), timing.span(), timing.every(), sent, null, null);
    kept.start();
    return Optional.of(kept);
  }

  /**
   * As {@link #hold}, for every key of {@code keys} or none ({@link PgFence#acquireAll}): one lease
   * per key, kept as a set, renewed with {@code lease_renew_all} in one call per renewal, released
   * with {@code lease_release_all}, and lost as a whole when one of its leases is (the keeper then
   * releases the others at once). {@link WaitTimedOutException} (named by the keys) when the set is
   * not granted within the wait. The acquire takes no token, so it is not sent again after a try
   * that may have been granted: {@link OutcomeUnknownException} then.
   *
   * @param keys the keys, each 1 to 512 bytes in UTF-8; their order does not matter
   * @param opts the leases' ttl, owner, wait, session_bound and durable; no token, shared, permits
   *     or lock-delay
   * @param keep how the lease is kept: renewal period, margin, backoff, bound, listener
   * @return the kept set, renewed in the background until released or lost
   * @throws IllegalArgumentException for options a set cannot take, or a renewal period that leaves
   *     no time to renew, before anything is sent
   * @throws WaitTimedOutException when the set was not granted within the options' wait
   * @throws OutcomeUnknownException when a try that may have been granted got no reply (the set, if
   *     granted, ends at its TTL)
   * @throws SQLException a server error that no retry can help (22023 for an argument it refuses,
   *     25006 on a standby), or {@link NoConnectionException} when no connection could be had
   *     before the retries ran out (nothing was sent)
   */
  public KeptLease holdAll(Collection<String> keys, AcquireOptions opts, KeepOptions keep)
      throws SQLException {
    opts.checkForSet();
    Timing timing = Timing.of(opts, keep);
    long sent = System.nanoTime();
    boolean bound = opts.isSessionBound();
    if (!bound) {
      reserveKeeper();
    }
    Retry retry = new Retry(backoff, keep.timeout().plus(opts.waitTime()), false, null, bound);
    record Granted(LeaseSet set, Connection conn) {}
    Optional<Granted> granted =
        observed(
            () ->
                retrying(
                    retry,
                    conn -> {
                      Optional<LeaseSet> set = PgFence.acquireAll(conn, keys, opts);
                      if (bound && set.isEmpty()) {
                        giveBack(conn);
                      }
                      return set.map(leases -> new Granted(leases, bound ? conn : null));
                    }));
    Granted set = granted.orElseThrow(() -> new WaitTimedOutException(String.join(", ", keys)));
    Lease first = set.set().leases().get(0);
    KeptLease kept =
        new KeptLease(
            this,
            first,
            keep,
            opts.ttl(),
            timing.span(),
            timing.every(),
            sent,
            set.conn(),
            set.set());
    kept.start();
    return kept;
  }

  /** How often a kept lease renews, and its deadline's span (ttl less the margin). */
  private record Timing(Duration span, Duration every) {
    /** {@link IllegalArgumentException} for a renewal period that leaves no time to renew. */
    static Timing of(AcquireOptions opts, KeepOptions keep) {
      Duration span = opts.ttl().minus(keep.marginFor(opts.ttl()));
      Duration every = keep.renewEveryFor(opts.ttl());
      if (every.isZero() || every.isNegative() || every.compareTo(span) >= 0) {
        throw new IllegalArgumentException(
            "renewEvery " + every + " must be above zero and below ttl less the margin, " + span);
      }
      return new Timing(span, every);
    }
  }

  /**
   * Stops the keeper (closing its connections) and the deadline timers of the kept leases (it does
   * not release them: close those).
   */
  @Override
  public void close() {
    synchronized (this) {
      if (keeper != null) {
        keeper.close();
      }
    }
    timers.shutdownNow();
    try {
      timers.awaitTermination(1, TimeUnit.SECONDS);
    } catch (InterruptedException interrupted) {
      Thread.currentThread().interrupt();
    }
  }
}
