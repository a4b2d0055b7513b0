package io.pgfence;

import java.sql.SQLException;

/**
 * An acquire's wait was ended by the server: {@code 57014} (cancelled, or {@code
 * statement_timeout}) or {@code 55P03} ({@code lock_timeout} while queued behind other waiters).
 * Nothing was granted. {@link #getSQLState()} says which.
 */
public class WaitCancelledException extends PgFenceException {
  private static final long serialVersionUID = 1L;

  /**
   * A wait the server ended.
   *
   * @param key the key waited for
   * @param cause the server's error: its SQLSTATE is this one's
   */
  public WaitCancelledException(String key, SQLException cause) {
    super(
        "waiting acquire of " + key + " ended: " + cause.getMessage(), cause.getSQLState(), cause);
  }
}
