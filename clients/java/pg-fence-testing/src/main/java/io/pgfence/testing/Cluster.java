package io.pgfence.testing;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.postgresql.ds.PGSimpleDataSource;

/**
 * A scratch PostgreSQL cluster made by the project's {@code pg_test/cluster} (PostgreSQL of {@code
 * $PG_MAJOR}, 15 by default), with pg_fence created. The Java suites take ports 27800-27849 and
 * 27970-27979.
 */
public final class Cluster implements AutoCloseable {
  private final String name;
  private final int port;

  /**
   * A cluster not made yet ({@link #create()} makes it).
   *
   * @param name its name, under {@code $PG_FENCE_TEST_DIR} as {@code java_<name>}
   * @param port its loopback port
   */
  public Cluster(String name, int port) {
    this.name = "java_" + name;
    this.port = port;
  }

  /**
   * The repository's root: the first directory above the working one with pg_test/cluster.
   *
   * @return the root's absolute path
   * @throws IllegalStateException when no directory above the working one has pg_test/cluster
   */
  public static Path root() {
    Path dir = Paths.get("").toAbsolutePath();
    while (dir != null) {
      if (Files.isExecutable(dir.resolve("pg_test/cluster"))) {
        return dir;
      }
      dir = dir.getParent();
    }
    throw new IllegalStateException(
        "pg_test/cluster not found above " + Paths.get("").toAbsolutePath());
  }

  /**
   * Destroys what a previous run left, creates and starts the cluster, creates pg_fence.
   *
   * @return this cluster, running
   * @throws IllegalStateException when pg_test/cluster fails (its error is on stderr) or pg_fence
   *     cannot be created
   */
  public Cluster create() {
    runQuietly("destroy", name);
    run("create", name, Integer.toString(port));
    run("start", name);
    try (Connection conn = connect("pg_fence_java_test");
        Statement statement = conn.createStatement()) {
      statement.execute("CREATE EXTENSION pg_fence");
    } catch (SQLException e) {
      throw new IllegalStateException(e);
    }
    return this;
  }

  /**
   * The cluster's port.
   *
   * @return its loopback port
   */
  public int port() {
    return port;
  }

  /**
   * The JDBC URL of its {@code postgres} database.
   *
   * @return the URL, on 127.0.0.1 and the cluster's port
   */
  public String url() {
    return "jdbc:postgresql://127.0.0.1:" + port + "/postgres";
  }

  /**
   * A DataSource of new connections (no pool) whose sessions carry {@code applicationName}.
   *
   * @param applicationName the sessions' application_name, by which tests find and end them
   * @return a DataSource of connections as user {@code postgres}
   */
  public PGSimpleDataSource dataSource(String applicationName) {
    return dataSource(applicationName, port);
  }

  /**
   * As {@link #dataSource(String)}, to another port (a proxy's).
   *
   * @param applicationName the sessions' application_name
   * @param port the loopback port to connect to
   * @return a DataSource of connections as user {@code postgres}, with a 10 s connect timeout
   */
  public static PGSimpleDataSource dataSource(String applicationName, int port) {
    PGSimpleDataSource source = new PGSimpleDataSource();
    source.setServerNames(new String[] {"127.0.0.1"});
    source.setPortNumbers(new int[] {port});
    source.setDatabaseName("postgres");
    source.setUser("postgres");
    source.setApplicationName(applicationName);
    source.setConnectTimeout(10);
    source.setTcpKeepAlive(true);
    return source;
  }

  /**
   * A new connection, as user {@code postgres}, whose session carries {@code applicationName}.
   *
   * @param applicationName the session's application_name
   * @return the connection, in autocommit; the caller closes it
   * @throws SQLException when the server cannot be reached
   */
  public Connection connect(String applicationName) throws SQLException {
    return dataSource(applicationName).getConnection();
  }

  /**
   * The first column of the first row of {@code sql} with {@code params}, as a String.
   *
   * @param sql one statement, with {@code ?} for each parameter
   * @param params the parameters, bound with {@code setObject} in order
   * @return the value; null for a SQL NULL, no row, or a statement that returns none
   * @throws IllegalStateException wrapping the server's error
   */
  public String sql(String sql, Object... params) {
    try (Connection conn = connect("pg_fence_java_test");
        PreparedStatement statement = conn.prepareStatement(sql)) {
      for (int i = 0; i < params.length; i++) {
        statement.setObject(i + 1, params[i]);
      }
      if (!statement.execute()) {
        return null;
      }
      try (ResultSet rows = statement.getResultSet()) {
        return rows.next() ? rows.getString(1) : null;
      }
    } catch (SQLException e) {
      throw new IllegalStateException(e);
    }
  }

  /**
   * Revokes the key's live lease (as a superuser).
   *
   * @param key the key whose live lease (or running lock-delay) ends
   */
  public void revoke(String key) {
    sql("SELECT fence.lease_revoke(?)", key);
  }

  /**
   * Ends every session of {@code applicationName} (pg_terminate_backend).
   *
   * @param applicationName the application_name of the sessions to end
   * @return how many sessions were signalled
   */
  public int terminate(String applicationName) {
    return Integer.parseInt(
        sql(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = ?",
            applicationName));
  }

  /**
   * The backend pids of {@code applicationName}'s sessions.
   *
   * @param applicationName the sessions' application_name
   * @return their pids now; empty for none
   */
  public List<Integer> backendPids(String applicationName) {
    List<Integer> pids = new ArrayList<>();
    try (Connection conn = connect("pg_fence_java_test");
        PreparedStatement statement =
            conn.prepareStatement("SELECT pid FROM pg_stat_activity WHERE application_name = ?")) {
      statement.setString(1, applicationName);
      try (ResultSet rows = statement.executeQuery()) {
        while (rows.next()) {
          pids.add(rows.getInt(1));
        }
      }
    } catch (SQLException e) {
      throw new IllegalStateException(e);
    }
    return pids;
  }

  /** kill -9 of the postmaster and all its children. */
  public void crash() {
    run("crash", name);
  }

  /** Starts the server (after {@link #stop()} or {@link #crash()}). */
  public void start() {
    run("start", name);
  }

  /** Stops the server (a fast shutdown). */
  public void stop() {
    run("stop", name);
  }

  /**
   * A signal to the postmaster and every process it started (STOP: the server stops answering, but
   * its kernel still accepts connections and acknowledges packets; CONT resumes it).
   *
   * @param signal the signal's name as kill(1) takes it, without the dash ({@code STOP}, {@code
   *     CONT})
   */
  public void signal(String signal) {
    try {
      String pid =
          Files.readAllLines(testDir().resolve(name).resolve("postmaster.pid")).get(0).trim();
      Process children = new ProcessBuilder("pgrep", "-P", pid).start();
      String kids = new String(children.getInputStream().readAllBytes()).trim();
      children.waitFor();
      List<String> command = new ArrayList<>(List.of("kill", "-" + signal, pid));
      if (!kids.isEmpty()) {
        command.addAll(List.of(kids.split("\\s+")));
      }
      new ProcessBuilder(command).inheritIO().start().waitFor();
    } catch (IOException e) {
      throw new IllegalStateException(e);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException(e);
    }
  }

  /** Stops the server and removes the cluster's directory. */
  public void destroy() {
    runQuietly("destroy", name);
  }

  @Override
  public void close() {
    destroy();
  }

  private static Path testDir() {
    String dir = System.getenv("PG_FENCE_TEST_DIR");
    return Paths.get(dir == null ? "/tmp/pg_fence_test" : dir);
  }

  private static void run(String... args) {
    int status = exec(false, args);
    if (status != 0) {
      throw new IllegalStateException("pg_test/cluster " + String.join(" ", args) + ": " + status);
    }
  }

  private static void runQuietly(String... args) {
    exec(true, args);
  }

  private static int exec(boolean quiet, String... args) {
    List<String> command = new ArrayList<>();
    command.add(root().resolve("pg_test/cluster").toString());
    command.addAll(List.of(args));
    ProcessBuilder builder =
        new ProcessBuilder(command).redirectOutput(ProcessBuilder.Redirect.DISCARD);
    builder.redirectError(
        quiet ? ProcessBuilder.Redirect.DISCARD : ProcessBuilder.Redirect.INHERIT);
    try {
      Process process = builder.start();
      if (!process.waitFor(120, TimeUnit.SECONDS)) {
        process.destroyForcibly();
        return -1;
      }
      return process.exitValue();
    } catch (IOException e) {
      throw new IllegalStateException(e);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException(e);
    }
  }
}
