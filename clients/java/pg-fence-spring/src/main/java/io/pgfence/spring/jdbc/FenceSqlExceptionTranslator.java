package io.pgfence.spring.jdbc;

import io.pgfence.LeaseLostException;
import io.pgfence.StaleFenceException;
import java.sql.SQLException;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.springframework.dao.DataAccessException;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.jdbc.support.AbstractFallbackSQLExceptionTranslator;
import org.springframework.jdbc.support.JdbcAccessor;
import org.springframework.jdbc.support.SQLExceptionTranslator;

/**
 * An {@link SQLExceptionTranslator} that turns pg_fence's SQLSTATEs into typed exceptions: PF001
 * into {@link LeaseLostDataAccessException}, PF002 into {@link StaleFenceDataAccessException}, and
 * hands every other error to the translator it wraps. Without it, a {@link JdbcTemplate} reports
 * both as {@link org.springframework.jdbc.UncategorizedSQLException}.
 *
 * <pre>{@code
 * FenceSqlExceptionTranslator.install(jdbcTemplate);
 * try {
 *   jdbcTemplate.update("UPDATE jobs SET done = true WHERE id = ? AND " + PgFence.GUARD, id, key, fence);
 * } catch (StaleFenceDataAccessException e) {
 *   // another holder took the key: stop
 * }
 * }</pre>
 *
 * <p>The Spring Boot starter installs it on every {@link JdbcAccessor} bean (JdbcTemplate and the
 * like) of the application context.
 */
public class FenceSqlExceptionTranslator extends AbstractFallbackSQLExceptionTranslator {
  private static final Pattern STALE = Pattern.compile("fence (\\d+) is stale for key \"(.*)\"");

  /**
   * A translator whose other errors go to {@code fallback}.
   *
   * @param fallback the translator of every error that is not pg_fence's
   */
  public FenceSqlExceptionTranslator(SQLExceptionTranslator fallback) {
    setFallbackTranslator(fallback);
  }

  /**
   * Puts a translator in front of {@code accessor}'s own; does nothing when it has one already.
   *
   * @param accessor a JdbcTemplate or another JdbcAccessor, its DataSource set
   */
  public static void install(JdbcAccessor accessor) {
    SQLExceptionTranslator current = accessor.getExceptionTranslator();
    if (!(current instanceof FenceSqlExceptionTranslator)) {
      accessor.setExceptionTranslator(new FenceSqlExceptionTranslator(current));
    }
  }

  /**
   * The typed exception of a pg_fence refusal found in {@code ex} or the exceptions chained to it.
   *
   * @param task what was being done, for the message
   * @param ex the error
   * @return the typed exception; null when the error is not pg_fence's
   */
  public static FenceDataAccessException typed(String task, SQLException ex) {
    for (Throwable cause = ex; cause != null; cause = cause.getCause()) {
      if (cause instanceof SQLException) {
        for (SQLException next = (SQLException) cause;
            next != null;
            next = next.getNextException()) {
          FenceDataAccessException found = typedOne(task, next);
          if (found != null) {
            return found;
          }
        }
      }
    }
    return null;
  }

  private static FenceDataAccessException typedOne(String task, SQLException ex) {
    String state = ex.getSQLState();
    String message = (task == null ? "" : task + ": ") + ex.getMessage();
    if ("PF002".equals(state)) {
      StaleFenceException stale;
      if (ex instanceof StaleFenceException) {
        stale = (StaleFenceException) ex;
      } else {
        Matcher named = STALE.matcher(String.valueOf(ex.getMessage()));
        stale =
            named.find()
                ? new StaleFenceException(named.group(2), Long.parseLong(named.group(1)), ex)
                : new StaleFenceException(null, -1, ex);
      }
      return new StaleFenceDataAccessException(message, stale);
    }
    if ("PF001".equals(state)) {
      LeaseLostException lost =
          ex instanceof LeaseLostException
              ? (LeaseLostException) ex
              : new LeaseLostException(null, null, ex);
      return new LeaseLostDataAccessException(message, lost);
    }
    return null;
  }

  @Override
  protected DataAccessException doTranslate(String task, String sql, SQLException ex) {
    return typed(task, ex);
  }
}
