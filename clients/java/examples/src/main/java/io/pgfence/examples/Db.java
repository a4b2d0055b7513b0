package io.pgfence.examples;

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.SQLException;
import java.sql.Statement;
import javax.sql.DataSource;
import org.postgresql.ds.PGSimpleDataSource;

/** What the examples share: a DataSource of the JDBC URL they are given, and plain SQL. */
final class Db {
  private Db() {}

  /** A DataSource of {@code url} (as jdbc:postgresql://host:port/db?user=...). */
  static DataSource source(String url, String applicationName) {
    PGSimpleDataSource source = new PGSimpleDataSource();
    source.setURL(url);
    source.setApplicationName(applicationName);
    return source;
  }

  static void execute(String url, String... statements) throws SQLException {
    try (Connection conn = DriverManager.getConnection(url);
        Statement statement = conn.createStatement()) {
      for (String sql : statements) {
        statement.execute(sql);
      }
    }
  }

  /** The first column of the first row of {@code sql}, as text. */
  static String value(String url, String sql) throws SQLException {
    try (Connection conn = DriverManager.getConnection(url);
        Statement statement = conn.createStatement();
        java.sql.ResultSet rows = statement.executeQuery(sql)) {
      return rows.next() ? rows.getString(1) : null;
    }
  }

  static String url(String[] args) {
    return args.length > 0 ? args[0] : "jdbc:postgresql://127.0.0.1:5432/postgres?user=postgres";
  }
}
