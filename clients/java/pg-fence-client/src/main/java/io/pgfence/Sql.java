package io.pgfence;

import java.math.BigDecimal;
import java.math.RoundingMode;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.time.Duration;
import java.time.Instant;
import java.time.OffsetDateTime;

/** What every call shares: binding intervals, reading rows, telling errors apart. */
final class Sql {
  private Sql() {}

  /** Binds a statement's parameters. */
  @FunctionalInterface
  interface Binder {
    void bind(PreparedStatement statement) throws SQLException;
  }

  /** Reads the answer from the statement's first row (null when there is none). */
  @FunctionalInterface
  interface Reader<T> {
    T read(ResultSet row) throws SQLException;
  }

  /** Runs one query and reads its first row; {@code row} gets null when it returned none. */
  static <T> T query(Connection conn, String sql, Binder binder, Reader<T> row)
      throws SQLException {
    try (PreparedStatement statement = conn.prepareStatement(sql)) {
      binder.bind(statement);
      try (ResultSet rows = statement.executeQuery()) {
        return row.read(rows.next() ? rows : null);
      }
    }
  }

  /**
   * An interval's text, to be bound with {@code ?::interval}: seconds with microseconds, the
   * server's precision ({@code "30.000000 seconds"}). {@code setObject(Duration)} does not work
   * with the driver, and a bare {@code setString} of {@code Duration.toString()} is not an interval
   * in every server's style.
   */
  static String interval(Duration duration) {
    BigDecimal seconds =
        BigDecimal.valueOf(duration.getSeconds())
            .add(BigDecimal.valueOf(duration.getNano(), 9))
            .setScale(6, RoundingMode.HALF_UP);
    return seconds.toPlainString() + " seconds";
  }

  static Instant instant(ResultSet row, String column) throws SQLException {
    OffsetDateTime at = row.getObject(column, OffsetDateTime.class);
    return at == null ? null : at.toInstant();
  }

  static Long nullableLong(ResultSet row, String column) throws SQLException {
    long value = row.getLong(column);
    return row.wasNull() ? null : value;
  }

  /**
   * Whether the call that failed so may still have taken effect: the connection broke (class 08, or
   * no SQLSTATE from the driver), or the server ended the session (57P0x), which can come after the
   * statement's work (a terminate during a commit's wait for a synchronous standby).
   */
  static boolean mayHaveTakenEffect(SQLException error) {
    String state = error.getSQLState();
    return state == null || state.startsWith("08") || state.startsWith("57P0");
  }

  /** Whether trying again, on a new connection, can help: a broken or refused session. */
  static boolean retryable(SQLException error) {
    return mayHaveTakenEffect(error) || "53300".equals(error.getSQLState());
  }

  static boolean hasState(SQLException error, String state) {
    return state.equals(error.getSQLState());
  }
}
