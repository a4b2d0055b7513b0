package io.pgfence.spring.jdbc;

import java.sql.Connection;
import java.sql.SQLException;
import java.util.Objects;
import java.util.function.Consumer;
import javax.sql.DataSource;
import org.springframework.dao.DataAccessException;
import org.springframework.jdbc.UncategorizedSQLException;
import org.springframework.jdbc.datasource.DataSourceUtils;
import org.springframework.transaction.PlatformTransactionManager;
import org.springframework.transaction.TransactionStatus;
import org.springframework.transaction.support.TransactionCallback;
import org.springframework.transaction.support.TransactionSynchronizationManager;
import org.springframework.transaction.support.TransactionTemplate;

/**
 * Spring transactions whose writes are fenced: each runs the lease's guard first on the
 * transaction's connection, so that every write of the transaction commits only while the lease's
 * fence is the key's live one. A stale holder's transaction is rolled back before its callback
 * runs, with {@link StaleFenceDataAccessException} (or {@link LeaseLostDataAccessException} when
 * its lease is known lost).
 *
 * <pre>{@code
 * fenced.execute(kept::guard, status -> {
 *   jdbcTemplate.update("UPDATE jobs SET done = true WHERE id = ?", id);
 *   return null;
 * });
 * }</pre>
 *
 * <p>In a {@code @Transactional} method, the same guard is one line, first in the method: {@code
 * FencedTransactions.guardCurrentTransaction(dataSource, kept::guard);}
 */
public final class FencedTransactions {
  private final TransactionTemplate template;
  private final DataSource dataSource;

  /**
   * Fenced transactions of {@code transactionManager} over {@code dataSource}.
   *
   * @param transactionManager the transaction manager of {@code dataSource} (a
   *     DataSourceTransactionManager, JdbcTransactionManager, or JpaTransactionManager on it)
   * @param dataSource the DataSource whose connection the transactions bind
   */
  public FencedTransactions(PlatformTransactionManager transactionManager, DataSource dataSource) {
    this(new TransactionTemplate(transactionManager), dataSource);
  }

  /**
   * Fenced transactions with {@code template}'s settings (propagation, isolation, timeout).
   *
   * @param template the template whose transactions are guarded
   * @param dataSource the DataSource whose connection the transactions bind
   */
  public FencedTransactions(TransactionTemplate template, DataSource dataSource) {
    this.template = Objects.requireNonNull(template);
    this.dataSource = Objects.requireNonNull(dataSource);
  }

  /**
   * Runs {@code action} in a transaction guarded by {@code guard}, committed when it returns.
   *
   * @param <T> the action's result type
   * @param guard the lease's guard, e.g. {@code kept::guard}
   * @param action the transaction's work
   * @return what {@code action} returned
   * @throws StaleFenceDataAccessException when the fence is stale (nothing is written)
   * @throws LeaseLostDataAccessException when the lease is known lost (nothing is written)
   * @throws IllegalStateException when the transaction manager's transactions are not on this
   *     DataSource (nothing is written)
   */
  public <T> T execute(ConnectionGuard guard, TransactionCallback<T> action) {
    Objects.requireNonNull(guard);
    return template.execute(
        status -> {
          guardCurrentTransaction(dataSource, guard);
          return action.doInTransaction(status);
        });
  }

  /**
   * As {@link #execute}, for work with no result.
   *
   * @param guard the lease's guard, e.g. {@code kept::guard}
   * @param action the transaction's work
   * @throws StaleFenceDataAccessException when the fence is stale (nothing is written)
   * @throws LeaseLostDataAccessException when the lease is known lost (nothing is written)
   * @throws IllegalStateException when the transaction manager's transactions are not on this
   *     DataSource (nothing is written)
   */
  public void executeWithoutResult(ConnectionGuard guard, Consumer<TransactionStatus> action) {
    execute(
        guard,
        status -> {
          action.accept(status);
          return null;
        });
  }

  /**
   * The {@code @Transactional} recipe: runs {@code guard} on the connection of the transaction in
   * progress on {@code dataSource}. Call it first in the transaction: its writes then commit only
   * under the live fence.
   *
   * @param dataSource the DataSource of the transaction in progress
   * @param guard the lease's guard, e.g. {@code kept::guard}
   * @throws IllegalStateException when no transaction is in progress, or when it is not on {@code
   *     dataSource} (its transaction manager binds another DataSource): a guard in a transaction of
   *     its own protects nothing, and nothing is written
   * @throws StaleFenceDataAccessException when the fence is stale
   * @throws LeaseLostDataAccessException when the lease is known lost
   */
  public static void guardCurrentTransaction(DataSource dataSource, ConnectionGuard guard) {
    if (!TransactionSynchronizationManager.isActualTransactionActive()) {
      throw new IllegalStateException(
          "no transaction in progress: guard inside a @Transactional method or a"
              + " FencedTransactions callback, where the writes that follow share its transaction");
    }
    // The transaction manager binds its DataSource's connection as the transaction begins. Had it
    // bound none to this one, getConnection would open and bind a connection of its own: a guard
    // there would hold back nothing while the transaction's writes commit on the other.
    if (!TransactionSynchronizationManager.hasResource(dataSource)) {
      throw new IllegalStateException(
          "the transaction in progress is not on this DataSource: its transaction manager binds"
              + " another one, so a guard here would not cover its writes. Give FencedTransactions"
              + " (or guardCurrentTransaction) the DataSource of the transaction manager");
    }
    Connection conn = DataSourceUtils.getConnection(dataSource);
    try {
      guard.guard(conn);
    } catch (SQLException e) {
      DataAccessException typed = FenceSqlExceptionTranslator.typed("fence guard", e);
      throw typed != null ? typed : new UncategorizedSQLException("fence guard", null, e);
    } finally {
      DataSourceUtils.releaseConnection(conn, dataSource);
    }
  }
}
