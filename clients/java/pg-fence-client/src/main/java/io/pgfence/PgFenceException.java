package io.pgfence;

import java.sql.SQLException;

/**
 * The base of pg_fence's own exceptions. They are {@link SQLException}s, so that code written
 * against JDBC handles them as it handles the driver's; {@link #getSQLState()} is the server's
 * SQLSTATE where there is one ({@code PF001}, {@code PF002}, {@code 57014}, ...). Errors of the
 * server that pg_fence does not type (bad input: {@code 22023}, {@code 22004}, a read-only
 * transaction: {@code 25006}, ...) are the driver's own exception, with its SQLSTATE, unchanged.
 */
public class PgFenceException extends SQLException {
  private static final long serialVersionUID = 1L;

  PgFenceException(String message, String sqlState, Throwable cause) {
    super(message, sqlState, cause);
  }
}
