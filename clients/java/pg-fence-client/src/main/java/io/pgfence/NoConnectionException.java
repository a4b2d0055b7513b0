package io.pgfence;

/** No connection could be had from the DataSource before the retries ran out: nothing was sent. */
public class NoConnectionException extends PgFenceException {
  private static final long serialVersionUID = 1L;

  /**
   * No connection before the retries ran out.
   *
   * @param cause the DataSource's last error
   */
  public NoConnectionException(Throwable cause) {
    super(
        "no connection: " + cause.getMessage(),
        cause instanceof java.sql.SQLException e ? e.getSQLState() : null,
        cause);
  }
}
