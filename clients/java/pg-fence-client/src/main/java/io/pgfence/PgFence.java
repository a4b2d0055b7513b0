package io.pgfence;

import java.sql.Array;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Types;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.OptionalLong;
import java.util.UUID;

/**
 * pg_fence's SQL API, one statement per call, on the caller's {@link Connection}: each call takes
 * part in the connection's transaction, as any statement does (a lease is granted, renewed or
 * released when that transaction commits). These calls never retry: {@link FenceClient} and the
 * kept lease do, on top of them.
 *
 * <p>Errors: {@link LeaseLostException} (PF001), {@link StaleFenceException} (PF002), {@link
 * WaitCancelledException} (57014, 55P03 while an acquire waits), {@link VersionConflictException}
 * (40001 from {@code versioned_update}); any other error of the server is the driver's own
 * exception with its SQLSTATE.
 */
public final class PgFence {
  private PgFence() {}

  private static final String LEASE_COLUMNS =
      "SELECT key, owner, fence, token, acquired_at, expires_at FROM ";

  /**
   * Grants {@code key} when it can (waiting up to the options' wait): the lease, or empty when the
   * key is held (or all its permits are) or the wait ran out. The server answers a refusal with a
   * row of NULLs, which is empty here. With the options' token, a retry after a lost reply gets the
   * lease that reply granted.
   *
   * @param conn the connection, whose transaction the grant takes part in
   * @param key the key, 1 to 512 bytes in UTF-8
   * @param opts the lease's ttl and the rest
   * @return the lease; empty when the key is held or the wait ran out
   * @throws IllegalArgumentException for options that cannot work together, before anything is sent
   * @throws WaitCancelledException when the wait was cancelled or timed out by the session's
   *     statement_timeout or lock_timeout (nothing was granted)
   * @throws SQLException the server's refusal of an argument (22023: a bad key, owner or ttl),
   *     25006 on a standby or in a read-only transaction, or the driver's
   */
  public static Optional<Lease> acquire(Connection conn, String key, AcquireOptions opts)
      throws SQLException {
    opts.check();
    UUID token = opts.token().orElseGet(UUID::randomUUID);
    try {
      return Sql.query(
          conn,
          acquireSql(opts),
          statement -> {
            int next = bindCommon(statement, opts, 2);
            statement.setString(1, key);
            statement.setObject(next++, token);
            if (opts.isShared()) {
              statement.setBoolean(next++, true);
            }
            if (opts.permits() != 1) {
              statement.setInt(next++, opts.permits());
            }
            if (!opts.lockDelay().isZero()) {
              statement.setString(next, Sql.interval(opts.lockDelay()));
            }
          },
          row -> Optional.ofNullable(row == null ? null : leaseOf(row, opts)));
    } catch (SQLException e) {
      throw waitError(key, e);
    }
  }

  /**
   * Grants the first key of {@code keys}, in their order, that is free now ({@code
   * fence.lease_acquire_any}: a held key is passed over, never waited for), an exclusive lease;
   * empty when none is free. The options' ttl, owner, session_bound, durable and token apply (with
   * the token, a retry after a lost reply gets the lease that reply granted); their wait does not.
   *
   * @param conn the connection, whose transaction the grant takes part in
   * @param keys the keys to try, in the order to try them; each 1 to 512 bytes in UTF-8
   * @param opts the lease's ttl and the rest; not shared, no permits
   * @return the lease of the first free key; empty when every key is held
   * @throws IllegalArgumentException for options that cannot work together, before anything is sent
   * @throws SQLException the server's refusal of an argument (22023), 25006 on a standby or in a
   *     read-only transaction, or the driver's
   */
  public static Optional<Lease> acquireAny(Connection conn, List<String> keys, AcquireOptions opts)
      throws SQLException {
    opts.check();
    UUID token = opts.token().orElseGet(UUID::randomUUID);
    return Sql.query(
        conn,
        LEASE_COLUMNS + "fence.lease_acquire_any(?::text[], ?::interval, ?, ?, ?, ?::uuid)",
        statement -> {
          statement.setArray(1, conn.createArrayOf("text", keys.toArray()));
          statement.setString(2, Sql.interval(opts.ttl()));
          if (opts.owner().isPresent()) {
            statement.setString(3, opts.owner().get());
          } else {
            statement.setNull(3, Types.VARCHAR);
          }
          statement.setBoolean(4, opts.isSessionBound());
          statement.setBoolean(5, opts.isDurable());
          statement.setObject(6, token);
        },
        row -> Optional.ofNullable(row == null ? null : leaseOf(row, opts)));
  }

  /** Binds ttl, owner, wait, session_bound and durable from {@code first}; the next index. */
  private static int bindCommon(PreparedStatement statement, AcquireOptions opts, int first)
      throws SQLException {
    statement.setString(first, Sql.interval(opts.ttl()));
    if (opts.owner().isPresent()) {
      statement.setString(first + 1, opts.owner().get());
    } else {
      statement.setNull(first + 1, Types.VARCHAR);
    }
    statement.setString(first + 2, Sql.interval(opts.waitTime()));
    statement.setBoolean(first + 3, opts.isSessionBound());
    statement.setBoolean(first + 4, opts.isDurable());
    return first + 5;
  }

  /**
   * lease_acquire's statement: {@code shared}, {@code permits} and {@code lock_delay} are passed by
   * name, and only when asked for, so that plain leases work on servers without them.
   */
  static String acquireSql(AcquireOptions opts) {
    StringBuilder sql =
        new StringBuilder(LEASE_COLUMNS)
            .append("fence.lease_acquire(?, ?::interval, ?, ?::interval, ?, ?, ?::uuid");
    if (opts.isShared()) {
      sql.append(", shared => ?");
    }
    if (opts.permits() != 1) {
      sql.append(", permits => ?");
    }
    if (!opts.lockDelay().isZero()) {
      sql.append(", lock_delay => ?::interval");
    }
    return sql.append(')').toString();
  }

  private static SQLException waitError(String key, SQLException e) {
    if (Sql.hasState(e, "57014") || Sql.hasState(e, "55P03")) {
      return new WaitCancelledException(key, e);
    }
    return e;
  }

  /** The lease of a {@code fence.lease} row; null for the row of NULLs of a refusal. */
  private static Lease leaseOf(ResultSet row, AcquireOptions opts) throws SQLException {
    Long fence = Sql.nullableLong(row, "fence");
    if (fence == null) {
      return null;
    }
    String owner = row.getString("owner");
    return new Lease(
        row.getString("key"),
        owner == null ? "" : owner,
        fence,
        row.getObject("token", UUID.class),
        Sql.instant(row, "acquired_at"),
        Sql.instant(row, "expires_at"),
        opts.isDurable(),
        opts.isShared(),
        opts.permits());
  }

  /**
   * Extends the live lease to now + {@code ttl} by the server's clock and returns the new expiry;
   * {@link LeaseLostException} (without its reason: {@link FenceClient#renew} asks it) when the
   * token no longer holds the live lease.
   *
   * @param conn the connection, whose transaction the renewal takes part in
   * @param lease the lease to renew (its key and token)
   * @param ttl the new time to live from now, above zero and at most {@code pg_fence.max_ttl}
   * @return the server's new expiry of the lease
   * @throws LeaseLostException when the token no longer holds the key's live lease
   * @throws SQLException the server's refusal of the ttl (22023), 25006 on a standby or in a
   *     read-only transaction, or the driver's
   */
  public static Instant renew(Connection conn, Lease lease, Duration ttl) throws SQLException {
    return renewBy(
        conn,
        "SELECT fence.lease_renew(?, ?, ?::interval)",
        lease.key(),
        statement -> statement.setString(1, lease.key()),
        lease.token(),
        ttl);
  }

  private static Instant renewBy(
      Connection conn, String sql, String label, Sql.Binder keys, UUID token, Duration ttl)
      throws SQLException {
    try {
      return Sql.query(
          conn,
          sql,
          statement -> {
            keys.bind(statement);
            statement.setObject(2, token);
            statement.setString(3, Sql.interval(ttl));
          },
          row -> row.getObject(1, java.time.OffsetDateTime.class).toInstant());
    } catch (SQLException e) {
      if (Sql.hasState(e, "PF001")) {
        throw new LeaseLostException(label, null, e);
      }
      throw e;
    }
  }

  /**
   * Ends the lease: true when this call ended it, false when the token held nothing (a retry is
   * harmless and never touches a newer holder).
   *
   * @param conn the connection, whose transaction the release takes part in
   * @param lease the lease to end (its key and token)
   * @return true when this call ended the lease; false when the token held nothing
   * @throws SQLException 25006 on a standby or in a read-only transaction, or the driver's
   */
  public static boolean release(Connection conn, Lease lease) throws SQLException {
    return release(conn, lease.key(), lease.token());
  }

  /**
   * {@link #release(Connection, Lease)} by the token alone.
   *
   * @param conn the connection, whose transaction the release takes part in
   * @param key the lease's key
   * @param token the token the lease was (or may have been) granted with
   * @return true when this call ended the lease; false when the token held nothing
   * @throws SQLException 25006 on a standby or in a read-only transaction, or the driver's
   */
  public static boolean release(Connection conn, String key, UUID token) throws SQLException {
    return Sql.query(
        conn,
        "SELECT fence.lease_release(?, ?)",
        statement -> {
          statement.setString(1, key);
          statement.setObject(2, token);
        },
        row -> row.getBoolean(1));
  }

  /**
   * Grants every key or none: one lease per key in key order, each with its own fence, sharing one
   * token the server draws; empty when one of them is held and the wait ran out. It takes no token,
   * so a try whose reply was lost cannot be retried safely ({@link FenceClient#acquireAll} does
   * not).
   *
   * @param conn the connection, whose transaction the grant takes part in
   * @param keys the keys, each 1 to 512 bytes in UTF-8; their order does not matter
   * @param opts the leases' ttl, owner, wait, session_bound and durable; no token, shared, permits
   *     or lock-delay
   * @return the set; empty when a key is held and the wait ran out
   * @throws IllegalArgumentException for options a set cannot take, before anything is sent
   * @throws WaitCancelledException when the wait was cancelled or timed out by the session's
   *     statement_timeout or lock_timeout (nothing was granted)
   * @throws SQLException the server's refusal of an argument (22023), 25006 on a standby or in a
   *     read-only transaction, or the driver's
   */
  public static Optional<LeaseSet> acquireAll(
      Connection conn, Collection<String> keys, AcquireOptions opts) throws SQLException {
    opts.checkForSet();
    String sql =
        LEASE_COLUMNS
            + "fence.lease_acquire_all(?, ?::interval, ?, ?::interval, ?, ?) ORDER BY key COLLATE \"C\"";
    List<Lease> leases = new ArrayList<>();
    try (PreparedStatement statement = conn.prepareStatement(sql)) {
      Array array = conn.createArrayOf("text", keys.toArray());
      statement.setArray(1, array);
      bindCommon(statement, opts, 2);
      try (ResultSet rows = statement.executeQuery()) {
        while (rows.next()) {
          Lease lease = leaseOf(rows, opts);
          if (lease != null) {
            leases.add(lease);
          }
        }
      }
    } catch (SQLException e) {
      throw waitError(String.join(", ", keys), e);
    }
    return leases.isEmpty()
        ? Optional.empty()
        : Optional.of(new LeaseSet(leases, leases.get(0).token()));
  }

  /**
   * Renews every lease of the set and returns the earliest new expiry; {@link LeaseLostException}
   * (named by the set's keys) when the token no longer holds one of them, and then none is renewed.
   *
   * @param conn the connection, whose transaction the renewal takes part in
   * @param set the set to renew (its keys and token)
   * @param ttl the new time to live from now, above zero and at most {@code pg_fence.max_ttl}
   * @return the earliest of the server's new expiries
   * @throws LeaseLostException when the token no longer holds one of the set's leases
   * @throws SQLException the server's refusal of the ttl (22023), 25006 on a standby or in a
   *     read-only transaction, or the driver's
   */
  public static Instant renewAll(Connection conn, LeaseSet set, Duration ttl) throws SQLException {
    return renewBy(
        conn,
        "SELECT fence.lease_renew_all(?, ?, ?::interval)",
        set.label(),
        statement -> statement.setArray(1, conn.createArrayOf("text", set.keys().toArray())),
        set.token(),
        ttl);
  }

  /**
   * Ends every lease of the set still held with its token.
   *
   * @param conn the connection, whose transaction the release takes part in
   * @param set the set to end (its keys and token)
   * @return how many leases this call ended: 0 to the set's size
   * @throws SQLException 25006 on a standby or in a read-only transaction, or the driver's
   */
  public static int releaseAll(Connection conn, LeaseSet set) throws SQLException {
    return Sql.query(
        conn,
        "SELECT fence.lease_release_all(?, ?)",
        statement -> {
          statement.setArray(1, conn.createArrayOf("text", set.keys().toArray()));
          statement.setObject(2, set.token());
        },
        row -> row.getInt(1));
  }

  /**
   * {@code fence.lease_status(key, token)}: whether the token's lease is live, or why it ended.
   *
   * @param conn the connection to ask on
   * @param key the lease's key
   * @param token the token the lease was (or may have been) granted with
   * @return the status; {@code ended} with reason {@code unknown} when the server knows nothing of
   *     the token
   * @throws SQLException the driver's, when the statement could not be run
   */
  public static LeaseStatus status(Connection conn, String key, UUID token) throws SQLException {
    return Sql.query(
        conn,
        "SELECT state, reason, fence, expires_at, current_fence FROM fence.lease_status(?, ?)",
        statement -> {
          statement.setString(1, key);
          statement.setObject(2, token);
        },
        row ->
            new LeaseStatus(
                row.getString("state"),
                row.getString("reason"),
                Sql.nullableLong(row, "fence"),
                Sql.instant(row, "expires_at"),
                Sql.nullableLong(row, "current_fence")));
  }

  /**
   * How the first of the leases {@code token} was granted on {@code keys} ended, in one statement:
   * the server's reason ({@code released}, {@code expired}, ...); null while every one is live.
   */
  static String firstEnded(Connection conn, List<String> keys, UUID token) throws SQLException {
    return Sql.query(
        conn,
        "SELECT s.reason FROM unnest(?::text[]) WITH ORDINALITY AS k(key, n)"
            + " CROSS JOIN LATERAL fence.lease_status(k.key, ?) AS s"
            + " WHERE s.state = 'ended' ORDER BY k.n LIMIT 1",
        statement -> {
          statement.setArray(1, conn.createArrayOf("text", keys.toArray()));
          statement.setObject(2, token);
        },
        row -> row == null ? null : String.valueOf(row.getString(1)));
  }

  /**
   * The last fence granted for {@code key}; empty if it was never granted (or its row was swept).
   *
   * @param conn the connection to ask on
   * @param key the key
   * @return the key's highest fence, live or not; empty when the server has no row for the key
   * @throws SQLException the driver's, when the statement could not be run
   */
  public static OptionalLong currentFence(Connection conn, String key) throws SQLException {
    return Sql.query(
        conn,
        "SELECT fence.current_fence(?)",
        statement -> statement.setString(1, key),
        row -> {
          Long fence = Sql.nullableLong(row, "current_fence");
          return fence == null ? OptionalLong.empty() : OptionalLong.of(fence);
        });
  }

  /**
   * The guard, for a write's own {@code WHERE} clause: {@code UPDATE t SET ... WHERE id = ? AND }
   * {@value}, bound with the key and the fence. A stale fence fails that statement with PF002:
   * {@link #typed(SQLException, String, long)} turns it into {@link StaleFenceException}.
   */
  public static final String GUARD = "fence.fence_guard(?, ?)";

  /**
   * The guard, first in the transaction of the writes: returns when {@code fence} is the key's live
   * fence, and holds back every grant of a higher fence until that transaction ends; {@link
   * StaleFenceException} otherwise. A guard in a transaction of its own protects nothing, so on an
   * autocommit connection this is an {@link IllegalStateException}, before anything is sent: call
   * {@code conn.setAutoCommit(false)} first, or use {@link #fencedUpdate} or {@link #GUARD}.
   *
   * @param conn the connection of the transaction to guard (not autocommit)
   * @param key the lease's key
   * @param fence the lease's fence, as granted
   * @throws IllegalStateException when {@code conn} is in autocommit, before anything is sent
   * @throws StaleFenceException when {@code fence} is not the key's live fence: roll back
   * @throws SQLException the server's refusal of the key (22023), or the driver's
   */
  public static void fenceGuard(Connection conn, String key, long fence) throws SQLException {
    if (conn.getAutoCommit()) {
      throw new IllegalStateException(
          "fence_guard on an autocommit connection protects nothing: the guard holds only until"
              + " its own transaction ends. Call it in the transaction of the writes"
              + " (setAutoCommit(false)), or use fencedUpdate or PgFence.GUARD in the write");
    }
    try {
      Sql.query(
          conn,
          "SELECT fence.fence_guard(?, ?)",
          statement -> {
            statement.setString(1, key);
            statement.setLong(2, fence);
          },
          row -> row.getBoolean(1));
    } catch (SQLException e) {
      throw typed(e, key, fence);
    }
  }

  /**
   * {@code e} as pg_fence's typed exception where it has one (PF001, PF002), else {@code e}: for
   * writes that use {@link #GUARD} in their own statements.
   *
   * @param e the statement's error
   * @param key the key the guard was given, which the typed exception names
   * @param fence the fence the guard was given
   * @return a {@link StaleFenceException} for PF002, a {@link LeaseLostException} (without its
   *     reason) for PF001, else {@code e} itself
   */
  public static SQLException typed(SQLException e, String key, long fence) {
    if (Sql.hasState(e, "PF002")) {
      return new StaleFenceException(key, fence, e);
    }
    if (Sql.hasState(e, "PF001")) {
      return new LeaseLostException(key, null, e);
    }
    return e;
  }

  /**
   * {@code UPDATE table SET changes WHERE filter} under the guard, in one statement: the number of
   * rows updated. {@code changes} and {@code filter} map column names to values.
   *
   * @param conn the connection to write on (in autocommit or in the caller's transaction)
   * @param key the lease's key
   * @param fence the lease's fence, as granted
   * @param table the table to update, as SQL names it ({@code "billing.invoices"})
   * @param changes the new values by column name, sent as a JSON object; not empty
   * @param filter the rows to update: column name to the value it must equal (all of them); not
   *     empty, no null value
   * @return the number of rows updated; 0 when none matched
   * @throws StaleFenceException when {@code fence} is not the key's live fence: nothing was written
   * @throws SQLException the server's, for a bad table, column or value (42P01, 42703, 22023, ...),
   *     or the driver's
   */
  public static long fencedUpdate(
      Connection conn,
      String key,
      long fence,
      String table,
      Map<String, ?> changes,
      Map<String, ?> filter)
      throws SQLException {
    return write(
        conn,
        "SELECT fence.fenced_update(?, ?, ?::regclass, ?::jsonb, ?::jsonb)",
        statement -> {
          statement.setString(1, key);
          statement.setLong(2, fence);
          statement.setString(3, table);
        },
        changes,
        filter,
        e -> typed(e, key, fence));
  }

  /**
   * Updates the rows matching {@code filter} only if none holds a higher fence in {@code
   * fenceColumn}, and stamps them with {@code fence}; {@link StaleFenceException} otherwise. For
   * tokens from elsewhere: the rows are the fence.
   *
   * @param conn the connection to write on (in autocommit or in the caller's transaction)
   * @param table the table to update, as SQL names it ({@code "billing.invoices"})
   * @param fenceColumn the column holding each row's last fence (a bigint, integer or smallint)
   * @param fence the writer's fence, from wherever it came
   * @param changes the new values by column name, sent as a JSON object; not empty
   * @param filter the rows to update: column name to the value it must equal (all of them); not
   *     empty, no null value
   * @return the number of rows updated; 0 when none matched
   * @throws StaleFenceException when a matching row holds a higher fence: nothing was written
   * @throws SQLException the server's, for a bad table, column or value (42P01, 42703, 42804,
   *     22023, ...), or the driver's
   */
  public static long fencedWrite(
      Connection conn,
      String table,
      String fenceColumn,
      long fence,
      Map<String, ?> changes,
      Map<String, ?> filter)
      throws SQLException {
    return tableWrite(
        conn,
        "fenced_write",
        table,
        fenceColumn,
        fence,
        changes,
        filter,
        e -> typed(e, null, fence));
  }

  /**
   * Updates the single row matching {@code filter} only if its version is {@code expectedVersion};
   * the new version. {@link VersionConflictException} when the row has another version; the
   * server's {@code P0002} when no row matches.
   *
   * @param conn the connection to write on (in autocommit or in the caller's transaction)
   * @param table the table to update, as SQL names it ({@code "docs"})
   * @param versionColumn the column holding the row's version (a bigint, integer or smallint)
   * @param expectedVersion the version the caller read the row at
   * @param changes the new values by column name, sent as a JSON object; not empty
   * @param filter the single row to update: column name to the value it must equal (all of them);
   *     not empty, no null value
   * @return the row's new version, {@code expectedVersion + 1}
   * @throws VersionConflictException when the row has another version: read it again and retry
   * @throws SQLException the server's {@code P0002} when no row matches, {@code 21000} when more
   *     than one does, its errors for a bad table, column or value, or the driver's
   */
  public static long versionedUpdate(
      Connection conn,
      String table,
      String versionColumn,
      long expectedVersion,
      Map<String, ?> changes,
      Map<String, ?> filter)
      throws SQLException {
    return tableWrite(
        conn,
        "versioned_update",
        table,
        versionColumn,
        expectedVersion,
        changes,
        filter,
        e ->
            Sql.hasState(e, "40001") ? new VersionConflictException(table, expectedVersion, e) : e);
  }

  /** fenced_write and versioned_update: (target, column, number, changes, filter). */
  private static long tableWrite(
      Connection conn,
      String function,
      String table,
      String column,
      long number,
      Map<String, ?> changes,
      Map<String, ?> filter,
      Translation translation)
      throws SQLException {
    return write(
        conn,
        "SELECT fence." + function + "(?::regclass, ?::name, ?, ?::jsonb, ?::jsonb)",
        statement -> {
          statement.setString(1, table);
          statement.setString(2, column);
          statement.setLong(3, number);
        },
        changes,
        filter,
        translation);
  }

  @FunctionalInterface
  private interface Translation {
    SQLException of(SQLException e);
  }

  private static long write(
      Connection conn,
      String sql,
      Sql.Binder first,
      Map<String, ?> changes,
      Map<String, ?> filter,
      Translation translation)
      throws SQLException {
    try {
      return Sql.query(
          conn,
          sql,
          statement -> {
            first.bind(statement);
            statement.setString(4, Json.of(changes));
            statement.setString(5, Json.of(filter));
          },
          row -> row.getLong(1));
    } catch (SQLException e) {
      throw translation.of(e);
    }
  }

  /**
   * {@code fence.await_change}: the key's leader (empty: nobody leads) as soon as it differs from
   * {@code seen} (null: none seen), or when {@code timeout} runs out, unchanged.
   *
   * @param conn the connection to wait on (the statement holds it, and its snapshot, meanwhile)
   * @param key the key to watch
   * @param seen the leader seen last; null for nobody leading (or nothing seen yet)
   * @param timeout how long to wait for a change at most; zero to ask without waiting
   * @return the key's leader; empty when nobody leads
   * @throws SQLException 57014 when the wait is cancelled or timed out by statement_timeout, the
   *     server's refusal of the key (22023), or the driver's
   */
  public static Optional<Leader> awaitChange(
      Connection conn, String key, Leader seen, Duration timeout) throws SQLException {
    return Sql.query(
        conn,
        "SELECT fence, owner, acquired_at, expires_at"
            + " FROM fence.await_change(?, ?, ?, ?::interval)",
        statement -> {
          statement.setString(1, key);
          if (seen == null) {
            statement.setNull(2, Types.BIGINT);
            statement.setNull(3, Types.VARCHAR);
          } else {
            statement.setLong(2, seen.fence());
            statement.setString(3, seen.owner());
          }
          statement.setString(4, Sql.interval(timeout));
        },
        PgFence::leaderOf);
  }

  private static Optional<Leader> leaderOf(ResultSet row) throws SQLException {
    Long fence = row == null ? null : Sql.nullableLong(row, "fence");
    if (fence == null) {
      return Optional.empty();
    }
    String owner = row.getString("owner");
    return Optional.of(
        new Leader(
            fence,
            owner == null ? "" : owner,
            Sql.instant(row, "acquired_at"),
            Sql.instant(row, "expires_at")));
  }

  /**
   * {@code fence.lease_proclaim}: changes the owner (a leader's value) of the live lease, keeping
   * its fence; false when the token no longer holds it.
   *
   * @param conn the connection, whose transaction the proclaim takes part in
   * @param lease the live lease (its key and token)
   * @param owner the new owner, at most 256 bytes in UTF-8; empty for the session's
   *     application_name
   * @return true when changed; false, changing nothing, when the token no longer holds the lease
   * @throws SQLException the server's refusal of the owner (22023), 25006 on a standby or in a
   *     read-only transaction, or the driver's
   */
  public static boolean proclaim(Connection conn, Lease lease, String owner) throws SQLException {
    return Sql.query(
        conn,
        "SELECT fence.lease_proclaim(?, ?, ?)",
        statement -> {
          statement.setString(1, lease.key());
          statement.setObject(2, lease.token());
          statement.setString(3, owner);
        },
        row -> row.getBoolean(1));
  }

  /**
   * {@code fence.lease_handoff}: ends the lease and grants the key, with a higher fence, to a
   * session waiting for it whose owner is {@code toOwner}: that new leader; empty, changing
   * nothing, when no such acquirer waits (or the token no longer holds the lease).
   *
   * @param conn the connection, whose transaction the hand-off takes part in
   * @param lease the lease to end (its key and token)
   * @param toOwner the owner the waiting acquirer asked with, 1 to 256 bytes in UTF-8
   * @return the new leader (without its token, which only it learns); empty when nobody took it
   * @throws SQLException the server's refusal of an argument (22023), 25006 on a standby or in a
   *     read-only transaction, 55P03 when writes under the old fence still ran after 5 s (nothing
   *     changed), or the driver's
   */
  public static Optional<Leader> handoff(Connection conn, Lease lease, String toOwner)
      throws SQLException {
    return Sql.query(
        conn,
        "SELECT fence, owner, acquired_at, expires_at FROM fence.lease_handoff(?, ?, ?)",
        statement -> {
          statement.setString(1, lease.key());
          statement.setObject(2, lease.token());
          statement.setString(3, toOwner);
        },
        PgFence::leaderOf);
  }

  /**
   * How many sessions wait for {@code key} now.
   *
   * @param conn the connection to ask on
   * @param key the key
   * @return the sessions in {@code lease_acquire} with a wait for the key, the first in line
   *     included; 0 for none
   * @throws SQLException the server's refusal of the key (22023), or the driver's
   */
  public static int waiters(Connection conn, String key) throws SQLException {
    return Sql.query(
        conn,
        "SELECT fence.waiters(?)",
        statement -> statement.setString(1, key),
        row -> row.getInt(1));
  }

  /**
   * {@code fence.lease_revoke} (fence_admin): ends the key's live lease, whoever holds it.
   *
   * @param conn the connection, whose transaction the revocation takes part in; its role must be a
   *     superuser or a member of {@code fence_admin}
   * @param key the key
   * @return true when a live lease was ended (or a running lock-delay lifted); false when there was
   *     neither
   * @throws SQLException 42501 for a role that may not revoke, 25006 on a standby or in a read-only
   *     transaction, or the driver's
   */
  public static boolean revoke(Connection conn, String key) throws SQLException {
    return Sql.query(
        conn,
        "SELECT fence.lease_revoke(?)",
        statement -> statement.setString(1, key),
        row -> row.getBoolean(1));
  }

  /**
   * Whether the session-bound lease of {@code key} with {@code fence} is bound to the session of
   * {@code conn}.
   */
  static boolean boundHere(Connection conn, String key, long fence) throws SQLException {
    return Sql.query(
        conn,
        "SELECT session_pid = pg_backend_pid() FROM fence.leases WHERE key = ? AND fence = ?",
        statement -> {
          statement.setString(1, key);
          statement.setLong(2, fence);
        },
        row -> row != null && row.getBoolean(1));
  }
}
