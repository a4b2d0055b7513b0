package io.pgfence;

import java.sql.Connection;
import java.sql.SQLException;
import java.sql.Statement;
import java.time.Duration;
import java.time.Instant;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import org.postgresql.PGConnection;

/**
 * A lease kept alive by {@link FenceClient#hold}: the client's {@link Keeper} renews it every
 * {@code renewEvery} (ttl/3) together with the client's other kept leases, over the keeper's few
 * connections (a session-bound lease, whose session is the lease, on its own connection), and tells
 * its holder the moment it is no longer held, through {@link #lost()} (a future completed with the
 * {@link LossReason}) and the {@link LeaseListener} of its {@link KeepOptions}.
 *
 * <p><b>The local deadline.</b> The keeper takes {@link System#nanoTime()} just before sending each
 * acquire or renew; when one succeeds, the deadline is that time plus the ttl, less a margin. The
 * server started its TTL later than that, so it cannot have expired the lease before the deadline
 * (with clocks whose rates differ by less than the margin). When the deadline passes without a
 * renewal confirmed, the lease is declared {@link State#UNKNOWN} ({@link LossReason#UNREACHABLE})
 * by a timer that a hung renewal does not hold up, and {@link #isHeld()} is false from that instant
 * whether or not any thread has run.
 *
 * <p>Check {@link #isHeld()} before each step of the work (or stop when {@link #lost()} completes),
 * and fence every write: {@link #guard(Connection)} in the writing transaction, or {@link
 * #fencedUpdate}. {@link #close()} releases the lease, bounded by {@link
 * KeepOptions#timeout(Duration)}.
 */
public final class KeptLease implements AutoCloseable {

  /** Where a kept lease stands. Once it leaves {@code HELD} it never comes back. */
  public enum State {
    /** Renewed in time: the server holds it for us until at least the local deadline. */
    HELD,
    /**
     * The server said the token no longer holds it (PF001, a stale guard, a release that found
     * nothing), for the reason {@link #reason()} gives.
     */
    LOST,
    /**
     * The local deadline passed without a renewal ({@link LossReason#UNREACHABLE}): the server may
     * still count it held, but its holder cannot know, so it must stop as if lost. Also a lease
     * whose release got no answer.
     */
    UNKNOWN,
    /** Ended by its holder ({@link #close()}): the server said so. */
    RELEASED
  }

  private final FenceClient client;
  private final Lease lease;

  /** A set's leases (lease is then its first); null for a single lease. */
  private final LeaseSet set;

  private final KeepOptions keep;
  private final Duration ttl;
  private final long spanNanos;
  private final long everyNanos;
  private final boolean sessionBound;
  private final Object monitor = new Object();
  private final CompletableFuture<LossReason> lost = new CompletableFuture<>();

  /** A session-bound lease's own renewing thread; null for a lease the client's keeper renews. */
  private final Thread keeper;

  /** The client's keeper; null for a session-bound lease. */
  private final Keeper shared;

  private final Thread holder = Thread.currentThread();
  private volatile long dueNanos;
  private volatile boolean inFlight;
  private int retries; // by the keeper's calls, one at a time per lease

  /**
   * Held around each renewal, and by an elector's proclaim and hand-off, which must not meet a
   * renewal in flight.
   */
  private final java.util.concurrent.locks.ReentrantLock renewing =
      new java.util.concurrent.locks.ReentrantLock();

  /** Used by the keeper thread only (and by start, before it runs). */
  private Connection conn;

  private volatile long deadline;
  private volatile Instant expiresAt;
  private volatile long toldAtNanos;
  private ScheduledFuture<?> timer; // guarded by monitor
  private State state = State.HELD; // guarded by monitor
  private LossReason reason; // guarded by monitor
  private boolean closing; // guarded by monitor
  private boolean started; // guarded by monitor: keptLeaseStarted was told
  private boolean endTold; // guarded by monitor: keptLeaseEnded was told, or is moot

  KeptLease(
      FenceClient client,
      Lease lease,
      KeepOptions keep,
      Duration ttl,
      Duration span,
      Duration every,
      long sentNanos,
      Connection bound,
      LeaseSet set) {
    this.client = client;
    this.lease = lease;
    this.set = set;
    this.keep = keep;
    this.ttl = ttl;
    this.spanNanos = span.toNanos();
    this.everyNanos = every.toNanos();
    this.sessionBound = bound != null;
    this.conn = bound;
    this.deadline = sentNanos + spanNanos;
    this.expiresAt = lease.expiresAt();
    this.dueNanos = sentNanos + everyNanos;
    if (sessionBound) {
      this.keeper = new Thread(this::keep, "pg-fence-keeper " + key());
      this.keeper.setDaemon(true);
      this.shared = null;
    } else {
      this.keeper = null;
      this.shared = client.keeper();
    }
  }

  /**
   * Starts keeping the lease. A session-bound lease whose acquire took longer than a renewal period
   * (a long wait, retries), and one of the shared keeper's whose deadline counted from the
   * acquire's send leaves less than a renewal period, are renewed at once, before the caller has
   * them: the deadline then counts from that renewal. On failure the lease is released and the
   * error thrown.
   */
  void start() throws SQLException {
    if (!sessionBound) {
      if (System.nanoTime() - (deadline - spanNanos) >= spanNanos - everyNanos) {
        // Less than a renewal period of the deadline left (a wait longer than the TTL passes it):
        // renewed before it is handed over, the deadline counted from this renewal. With more
        // left, it is due already and the keeper renews it now, with the others due.
        renewBeforeHandOver();
      }
      synchronized (monitor) {
        scheduleTimer();
      }
      startKept();
      shared.add(this);
      return;
    }
    if (System.nanoTime() - (deadline - spanNanos) >= everyNanos) {
      try {
        long sent = System.nanoTime();
        Instant expiry = renewOnce(keep.timeout().toNanos());
        deadline = sent + spanNanos;
        expiresAt = expiry;
      } catch (SQLException e) {
        dropConnection();
        try {
          releaseBounded();
        } catch (SQLException ignored) {
          // The lease ends at its TTL.
        }
        throw e;
      }
    }
    synchronized (monitor) {
      scheduleTimer();
    }
    startKept();
    keeper.start();
  }

  /**
   * The shared keeper's lease renewed now, through the client; on failure given back, and thrown.
   */
  private void renewBeforeHandOver() throws SQLException {
    long sent = System.nanoTime();
    try {
      Instant expiry = set == null ? client.renew(lease, ttl) : client.renewAll(set, ttl);
      deadline = sent + spanNanos;
      dueNanos = sent + everyNanos;
      expiresAt = expiry;
    } catch (SQLException | RuntimeException e) {
      for (Lease granted : set == null ? List.of(lease) : set.leases()) {
        shared.releaseToken(granted.key(), granted.token(), ttl);
      }
      throw e;
    }
  }

  /**
   * The lease, with the server's expiry after the last renewal.
   *
   * @return the lease as granted, its {@code expiresAt} the latest the server gave
   */
  public Lease lease() {
    return lease.withExpiresAt(expiresAt);
  }

  /**
   * The key.
   *
   * @return the lease's key; a set's keys, comma-separated
   */
  public String key() {
    return set == null ? lease.key() : set.label();
  }

  /**
   * The keys: the lease's, or the set's in key order.
   *
   * @return an unmodifiable list of one key or more
   */
  public List<String> keys() {
    return set == null ? List.of(lease.key()) : set.keys();
  }

  /**
   * The set this keeps ({@link FenceClient#holdAll}).
   *
   * @return the set as granted; empty for a single lease
   */
  public Optional<LeaseSet> leaseSet() {
    return Optional.ofNullable(set);
  }

  /**
   * The fence of {@code key}'s lease (of the set, or the lease's own key).
   *
   * @param key a key this keeps
   * @return its fence; empty for another key
   */
  public java.util.OptionalLong fence(String key) {
    return set == null
        ? (lease.key().equals(key)
            ? java.util.OptionalLong.of(lease.fence())
            : java.util.OptionalLong.empty())
        : set.fence(key);
  }

  /**
   * The fence to guard every write with (a set's: its first key's; see {@link #fence(String)}).
   *
   * @return the lease's fence, the same for the whole hold
   */
  public long fence() {
    return lease.fence();
  }

  /**
   * The holder's token, which renew and release need.
   *
   * @return the token; a set's one token
   */
  public UUID token() {
    return lease.token();
  }

  /**
   * The server's expiry after the last renewal.
   *
   * @return the server's clock reading at which the lease ends short of another renewal
   */
  public Instant expiresAt() {
    return expiresAt;
  }

  /**
   * True until the local deadline passes without a renewal, or the lease is lost or released;
   * judged from {@link System#nanoTime()} at each call, whether or not the keeper has run.
   *
   * @return true while the state is {@code HELD}
   */
  public boolean isHeld() {
    return state() == State.HELD;
  }

  /**
   * Where the lease stands now, the deadline included.
   *
   * @return the state; {@code UNKNOWN} once the local deadline has passed without a renewal
   */
  public State state() {
    if (System.nanoTime() - deadline >= 0) {
      declare(State.UNKNOWN, LossReason.UNREACHABLE);
    }
    synchronized (monitor) {
      return state;
    }
  }

  /**
   * Why the lease was lost: with {@code LOST} and {@code UNKNOWN}; empty while held and once
   * released.
   *
   * @return the reason; empty while held and once released
   */
  public Optional<LossReason> reason() {
    state();
    synchronized (monitor) {
      return Optional.ofNullable(reason);
    }
  }

  /**
   * The time left before the local deadline.
   *
   * @return the time left, from {@link System#nanoTime()} now; zero once the deadline has passed
   */
  public Duration timeLeft() {
    return Duration.ofNanos(Math.max(0, deadline - System.nanoTime()));
  }

  /**
   * Completed with the reason the moment the lease is lost while held; cancelled when the holder
   * closes it first. A copy: completing or cancelling it changes nothing here.
   *
   * @return a new future of the loss
   */
  public CompletableFuture<LossReason> lost() {
    // Not lost.copy(): a copy of a cancelled future completes exceptionally, and is not cancelled.
    CompletableFuture<LossReason> copy = new CompletableFuture<>();
    lost.whenComplete(
        (reason, error) -> {
          if (error == null) {
            copy.complete(reason);
          } else if (lost.isCancelled()) {
            copy.cancel(false);
          } else {
            copy.completeExceptionally(error);
          }
        });
    return copy;
  }

  /** The thread that took the lease. */
  Thread holder() {
    return holder;
  }

  /**
   * When the loss was told. For measurements.
   *
   * @return {@link System#nanoTime()} at the telling; 0 while held
   */
  public long toldAtNanos() {
    return toldAtNanos;
  }

  /**
   * Returns while held, so that a holder can stop between steps.
   *
   * @throws LeaseLostException with the reason, once the lease is not held
   */
  public void check() throws LeaseLostException {
    if (!isHeld()) {
      throw new LeaseLostException(key(), reason().orElse(null), null);
    }
  }

  /**
   * {@link #check()}, then the server's guard in the caller's transaction on {@code conn} ({@link
   * PgFence#fenceGuard}: not in autocommit). A {@link StaleFenceException} from the server also
   * ends the kept lease, with the reason the server gives.
   *
   * @param conn the connection of the transaction to guard (not autocommit)
   * @throws LeaseLostException when the lease is already known lost, before asking the server
   * @throws StaleFenceException when the server refuses the fence: roll back
   * @throws IllegalStateException when {@code conn} is in autocommit, before anything is sent
   * @throws SQLException the driver's, when the guard could not be run
   */
  public void guard(Connection conn) throws SQLException {
    guard(conn, lease.key());
  }

  /**
   * {@link #guard(Connection)} of one key of a set, under its own fence (for a single lease, its
   * key).
   *
   * @param conn the connection of the transaction to guard (not autocommit)
   * @param key the key whose fence guards the transaction, one this keeps
   * @throws IllegalArgumentException for a key it does not keep
   * @throws LeaseLostException when the lease is already known lost, before asking the server
   * @throws StaleFenceException when the server refuses the fence: roll back
   * @throws SQLException the driver's, when the guard could not be run
   */
  public void guard(Connection conn, String key) throws SQLException {
    long keyFence =
        fence(key).orElseThrow(() -> new IllegalArgumentException("not kept here: " + key));
    check();
    try {
      PgFence.fenceGuard(conn, key, keyFence);
    } catch (StaleFenceException stale) {
      lostByServer();
      throw stale;
    }
  }

  /**
   * {@link #check()}, then {@link PgFence#fencedUpdate} on {@code conn} under this lease's fence; a
   * {@link StaleFenceException} ends the kept lease as {@link #guard} does.
   *
   * @param conn the connection to write on (in autocommit or in the caller's transaction)
   * @param table the table to update, as SQL names it ({@code "billing.invoices"})
   * @param changes the new values by column name; not empty
   * @param filter the rows to update: column name to the value it must equal (all of them); not
   *     empty, no null value
   * @return the number of rows updated; 0 when none matched
   * @throws LeaseLostException when the lease is already known lost, before asking the server
   * @throws StaleFenceException when the server refuses the fence: nothing was written
   * @throws SQLException the server's, for a bad table, column or value
   */
  public long fencedUpdate(
      Connection conn, String table, Map<String, ?> changes, Map<String, ?> filter)
      throws SQLException {
    check();
    try {
      return PgFence.fencedUpdate(conn, lease.key(), lease.fence(), table, changes, filter);
    } catch (StaleFenceException stale) {
      lostByServer();
      throw stale;
    }
  }

  /** The bound on the release (and the questions after it). */
  Duration timeout() {
    return keep.timeout();
  }

  /** The lock each renewal holds. */
  java.util.concurrent.locks.ReentrantLock renewing() {
    return renewing;
  }

  /**
   * Stops renewing without releasing: the lease ended by its holder's own hand-off ({@code
   * RELEASED}), or left to expire at its TTL ({@code UNKNOWN}). The listener is not told; {@link
   * #lost()} is cancelled.
   */
  void abandon(State end) {
    synchronized (monitor) {
      if (closing) {
        return;
      }
      closing = true;
      if (state == State.HELD) {
        state = end;
        reason = end == State.UNKNOWN ? LossReason.UNKNOWN : null;
      }
      if (timer != null) {
        timer.cancel(false);
      }
      monitor.notifyAll();
    }
    lost.cancel(false);
    endKept();
  }

  /**
   * Stops renewing without releasing, and returns once no renewal is in flight: the lease then runs
   * out at its server expiry, which the holder may set first with {@link FenceClient#renew} (for a
   * key that must stay taken a while after the work, as ShedLock's {@code lockAtLeastFor}). The
   * state becomes {@code RELEASED}; {@link #lost()} is cancelled and the listener is not told.
   * Nothing once the lease has ended or is closing.
   */
  public void stopRenewing() {
    abandon(State.RELEASED);
    // A renewal already sent would set the expiry back to a whole ttl after the caller's own.
    renewing.lock();
    renewing.unlock();
  }

  /**
   * The server said the token no longer holds the lease: lost, for the reason lease_status gives.
   */
  void lostByServer() {
    LossReason why = client.lossReason(keys(), lease.token(), lease.durable(), keep.timeout());
    declare(State.LOST, why == null ? LossReason.UNKNOWN : why);
  }

  /**
   * Moves a held lease to LOST or UNKNOWN and tells it: the future, then the listener. Not while
   * closing: the holder's own release says what became of it.
   */
  private void declare(State end, LossReason why) {
    if (mark(end, why)) {
      tellLost(why);
    }
  }

  /** Moves a held lease to LOST or UNKNOWN: false when it was not held, or is closing. */
  private boolean mark(State end, LossReason why) {
    synchronized (monitor) {
      if (state != State.HELD || closing) {
        return false;
      }
      state = end;
      reason = why;
      toldAtNanos = System.nanoTime();
      if (timer != null) {
        timer.cancel(false);
      }
      monitor.notifyAll();
    }
    return true;
  }

  /** Tells the loss {@link #mark} made: the future, the observers, then the listener. */
  private void tellLost(LossReason why) {
    lost.complete(why);
    endKept();
    client.observers().leaseLost(this, why);
    LeaseListener listener = keep.listener();
    if (listener != null) {
      Callbacks.run(() -> listener.onLost(this, why));
    }
  }

  /** Arms the deadline's timer for the current deadline. Holds the monitor. */
  private void scheduleTimer() {
    if (timer != null) {
      timer.cancel(false);
    }
    long left = deadline - System.nanoTime();
    timer =
        client
            .timers()
            .schedule(
                () -> {
                  if (System.nanoTime() - deadline >= 0) {
                    declare(State.UNKNOWN, LossReason.UNREACHABLE);
                  }
                },
                Math.max(0, left),
                TimeUnit.NANOSECONDS);
  }

  boolean keeping() {
    synchronized (monitor) {
      return !closing && state == State.HELD;
    }
  }

  Duration ttl() {
    return ttl;
  }

  long dueNanos() {
    return dueNanos;
  }

  /** How early a renewal may go with others: a tenth of the period. */
  long earlyNanos() {
    return everyNanos / 10;
  }

  long deadlineNanos() {
    return deadline;
  }

  boolean inFlight() {
    return inFlight;
  }

  void inFlight(boolean sending) {
    inFlight = sending;
  }

  /** The statement_timeout of a renewal on the keeper's connections: the renewal period. */
  long everyMillis() {
    return Math.max(1, TimeUnit.NANOSECONDS.toMillis(everyNanos));
  }

  /**
   * How long one renewal may take before it is abandoned with its connection: a period, and never
   * past the deadline, so that another try has time.
   */
  long tryBoundNanos() {
    return Math.max(
        TimeUnit.MILLISECONDS.toNanos(1), Math.min(everyNanos, deadline - System.nanoTime()));
  }

  /** Tried again {@code nanos} from now (its elector holds it for a proclaim or hand-off). */
  void postpone(long nanos) {
    dueNanos = System.nanoTime() + nanos;
  }

  /**
   * The keeper's renewal, sent at {@code sent}, was answered with {@code expiry}: false when the
   * answer came after the deadline, which {@link #state()} then declares.
   */
  boolean renewed(long sent, Instant expiry) {
    retries = 0;
    if (System.nanoTime() - deadline >= 0) {
      return false;
    }
    synchronized (monitor) {
      deadline = sent + spanNanos;
      expiresAt = expiry;
      dueNanos = sent + everyNanos;
      if (state == State.HELD) {
        scheduleTimer();
      }
    }
    return true;
  }

  /**
   * The keeper's renewal got no answer: tried again after the backoff, until the deadline's timer
   * says unreachable.
   */
  void renewFailed() {
    long sleep = keep.retry().delay(retries++).toNanos();
    dueNanos = System.nanoTime() + Math.max(0, Math.min(sleep, deadline - System.nanoTime()));
  }

  /**
   * The server said the token holds the lease no more (a NULL of lease_renew_many): lost, for
   * {@code why} (lease_status's reason, asked on the keeper's connection; null: it gave none). A
   * set is lost whole, its other leases released. The state changes at once; the returned telling
   * (the future, observers, listener, a set's release) is run by the keeper once its locks are
   * given back.
   */
  Runnable notHeld(LossReason why) {
    LossReason reason = why == null ? LossReason.UNKNOWN : why;
    if (!mark(State.LOST, reason)) {
      return () -> {};
    }
    return () -> {
      tellLost(reason);
      if (set != null) {
        Thread release =
            new Thread(
                () -> {
                  try {
                    releaseBounded();
                  } catch (SQLException ignored) {
                    // They end at their TTL.
                  }
                },
                "pg-fence-release " + key());
        release.setDaemon(true);
        release.start();
      }
    };
  }

  /** A session-bound lease's thread: pause, renew, until the lease ends or is closed. */
  private void keep() {
    try {
      while (pauseUntil(deadline - spanNanos + everyNanos) && renewUntilAnswered()) {
        // Renewed: pause again.
      }
    } finally {
      dropConnection();
    }
  }

  /**
   * Sleeps until {@code due}; false when the lease ended or is closing meanwhile. A session-bound
   * lease's connection is watched meanwhile (the server writes to an idle session only to end it):
   * when it closes, the renewal that follows at once finds the session gone.
   */
  private boolean pauseUntil(long due) {
    while (keeping()) {
      long left = due - System.nanoTime();
      if (left <= 0) {
        return true;
      }
      long millis = Math.max(1, Math.min(TimeUnit.NANOSECONDS.toMillis(left), 250));
      if (sessionBound) {
        try {
          conn.unwrap(PGConnection.class).getNotifications((int) millis);
        } catch (SQLException closed) {
          return keeping();
        }
      } else {
        synchronized (monitor) {
          if (!closing && state == State.HELD) {
            try {
              monitor.wait(millis);
            } catch (InterruptedException interrupted) {
              return false;
            }
          }
        }
      }
    }
    return false;
  }

  /**
   * Tries until the server answers: true when renewed in time; false when the lease ended (lost,
   * unknown) or is closing.
   */
  private boolean renewUntilAnswered() {
    int retry = 0;
    while (keeping()) {
      long left = deadline - System.nanoTime();
      if (left <= 0) {
        declare(State.UNKNOWN, LossReason.UNREACHABLE);
        return false;
      }
      // A try that hangs is abandoned in time for another on a new connection, but for a
      // session-bound lease, which would end with its connection.
      long limit = sessionBound ? left : Math.min(everyNanos, left);
      long sent = 0;
      long took = 0;
      FenceObserver.RenewOutcome outcome = null; // null: nothing sent
      try {
        Instant expiry;
        renewing.lock();
        try {
          if (!keeping()) {
            return false;
          }
          sent = System.nanoTime();
          outcome = FenceObserver.RenewOutcome.ERROR;
          expiry = renewOnce(limit);
          outcome = FenceObserver.RenewOutcome.OK;
        } catch (LeaseLostException e) {
          outcome = FenceObserver.RenewOutcome.LOST;
          throw e;
        } finally {
          took = System.nanoTime() - sent;
          renewing.unlock();
        }
        if (System.nanoTime() - deadline >= 0) {
          declare(State.UNKNOWN, LossReason.UNREACHABLE);
          return false;
        }
        synchronized (monitor) {
          deadline = sent + spanNanos;
          expiresAt = expiry;
          if (state == State.HELD) {
            scheduleTimer();
          }
        }
        return true;
      } catch (LeaseLostException e) {
        ended(LossReason.UNKNOWN);
        return false;
      } catch (SQLException e) {
        boolean closed = isClosed(conn);
        if (sessionBound && (Sql.mayHaveTakenEffect(e) || closed)) {
          // A session-bound lease cannot move to another connection: once its own broke (or may
          // have), the session holding it is gone or out of reach.
          dropConnection();
          ended(LossReason.SESSION_ENDED);
          return false;
        }
        if (!sessionBound) {
          dropConnection();
        }
      } finally {
        // Told with the lock given back and the deadline moved: an observer that blocks holds up
        // neither stopRenewing nor the deadline this renewal moved.
        if (outcome != null) {
          tellRenewed(took, outcome);
        }
      }
      long sleep = Math.min(keep.retry().delay(retry++).toNanos(), deadline - System.nanoTime());
      if (sleep > 0) {
        synchronized (monitor) {
          try {
            TimeUnit.NANOSECONDS.timedWait(monitor, sleep);
          } catch (InterruptedException interrupted) {
            return false;
          }
        }
      }
    }
    return false;
  }

  /** Tells the client's observers of one renewal of a session-bound lease. */
  private void tellRenewed(long tookNanos, FenceObserver.RenewOutcome outcome) {
    Observers observers = client.observers();
    if (observers.any()) {
      observers.renewFinished(Duration.ofNanos(tookNanos), outcome, 1);
    }
  }

  /** Tells the observers once that this lease is kept no more (after {@link #start}). */
  private void endKept() {
    boolean tell;
    synchronized (monitor) {
      tell = started && !endTold;
      endTold = true;
    }
    if (tell) {
      client.observers().keptLeaseEnded(this);
    }
  }

  /** Tells the observers that this lease is kept, unless it ended already. */
  private void startKept() {
    synchronized (monitor) {
      if (endTold) {
        return;
      }
      started = true;
    }
    client.observers().keptLeaseStarted(this);
  }

  /**
   * The server said the lease is not held (or a session-bound lease's session is gone): lost, told
   * one statement later with the reason lease_status gives ({@code otherwise} when it has none). A
   * session-bound lease is then released by its token on another connection: its backend may live
   * on, cut off from us, holding the key until the server notices.
   */
  private void ended(LossReason otherwise) {
    if (!keeping()) {
      return;
    }
    // One try, bounded short: the holder is told at once, with the reason if the server gives it
    // in time (a server that crashed gives none: the reason is then `otherwise`).
    long second = TimeUnit.SECONDS.toNanos(1);
    Duration bound =
        Duration.ofNanos(Math.min(everyNanos, Math.min(keep.timeout().toNanos(), second)));
    LossReason why = client.lossReasonOnce(keys(), lease.token(), lease.durable(), bound);
    declare(State.LOST, why == null ? otherwise : why);
    // A set is lost whole when one of its leases is: the others would be held for nothing.
    if (sessionBound || set != null) {
      try {
        releaseBounded();
      } catch (SQLException ignored) {
        // It ends with its session, or at its TTL.
      }
    }
  }

  /** One renewal on the session-bound lease's own connection, every read bounded. */
  private Instant renewOnce(long limitNanos) throws SQLException {
    if (conn == null) {
      // Its session is gone with its connection: nothing else can renew it.
      throw new SQLException("the session-bound lease's connection is closed", "08003");
    }
    int millis = (int) Math.max(1, Math.min(Integer.MAX_VALUE, limitNanos / 1_000_000 + 1));
    conn.setNetworkTimeout(FenceClient.DIRECT, millis);
    return set == null ? PgFence.renew(conn, lease, ttl) : PgFence.renewAll(conn, set, ttl);
  }

  private static boolean isClosed(Connection conn) {
    try {
      return conn == null || conn.isClosed();
    } catch (SQLException e) {
      return true;
    }
  }

  /** Gives the keeper's connection back (a broken one is aborted). */
  private void dropConnection() {
    Connection current = conn;
    conn = null;
    if (current == null) {
      return;
    }
    if (isClosed(current)) {
      FenceClient.abort(current);
      return;
    }
    try (Statement statement = current.createStatement()) {
      current.setNetworkTimeout(FenceClient.DIRECT, 1000);
      statement.execute("RESET statement_timeout");
      FenceClient.giveBack(current);
    } catch (SQLException e) {
      FenceClient.abort(current);
    }
  }

  /**
   * Stops renewing and releases the lease by its token on a connection of its own (a renewal in
   * flight on the keeper's connection cannot bring it back: a renewal extends only a live lease),
   * retried within {@link KeepOptions#timeout(Duration)}. True when the server said this release
   * ended the lease. The state then says what became of it: {@code RELEASED} when the server said
   * so, {@code LOST} (with the reason) when the token no longer held it, {@code UNKNOWN} with no
   * answer (it ends at its TTL). A lease already lost is not released again.
   *
   * @return true when the server said this release ended the lease; false when it was already lost
   *     or released, or the server did not answer in time
   */
  public boolean release() {
    State was;
    synchronized (monitor) {
      if (closing) {
        return false;
      }
      closing = true;
      was = state;
      if (timer != null) {
        timer.cancel(false);
      }
      monitor.notifyAll();
    }
    lost.cancel(false);
    endKept();
    if (was == State.LOST || was == State.RELEASED) {
      return false;
    }
    State end;
    LossReason why = null;
    boolean released = false;
    try {
      released = releaseBounded();
      if (released) {
        end = State.RELEASED;
      } else {
        String ended = client.endedBy(keys(), lease.token(), keep.timeout());
        why = LossReason.ofStatus(ended, lease.durable());
        end = why == null ? State.RELEASED : State.LOST;
      }
    } catch (SQLException e) {
      end = State.UNKNOWN;
      why = LossReason.UNREACHABLE;
    }
    synchronized (monitor) {
      if (state == State.HELD || end != State.UNKNOWN) {
        state = end;
        reason = why;
      }
    }
    if (was == State.HELD && end == State.LOST) {
      client.observers().leaseLost(this, why);
    }
    return released;
  }

  /**
   * Releases by the token, retried within the timeout: whether it ended the lease (every lease of a
   * set).
   */
  private boolean releaseBounded() throws SQLException {
    if (set == null) {
      return client.releaseToken(lease.key(), lease.token(), keep.timeout());
    }
    return client.releaseAll(set, keep.timeout()) == set.leases().size();
  }

  /** {@link #release()}. */
  @Override
  public void close() {
    release();
  }

  @Override
  public String toString() {
    return "KeptLease[" + key() + ", fence " + lease.fence() + ", " + state() + "]";
  }
}
