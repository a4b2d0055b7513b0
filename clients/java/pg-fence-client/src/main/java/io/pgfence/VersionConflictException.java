package io.pgfence;

import java.sql.SQLException;

/**
 * {@code 40001} from {@code versioned_update} (or the versioning trigger): the row has another
 * version than the one expected. Nothing was written; read the row again and retry.
 */
public class VersionConflictException extends PgFenceException {
  private static final long serialVersionUID = 1L;

  /**
   * A versioned update refused.
   *
   * @param table the table of the row
   * @param expected the version the update expected
   * @param cause the server's error
   */
  public VersionConflictException(String table, long expected, SQLException cause) {
    super(
        "version conflict on " + table + ": expected version " + expected + " is not the row's",
        "40001",
        cause);
  }
}
