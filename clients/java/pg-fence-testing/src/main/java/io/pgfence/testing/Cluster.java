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
 * $PG_MAJOR}, 15 by default), with pg_fence created. The Java suites take ports 27800-27849.
 */
public final class Cluster implements AutoCloseable {
  private final String name;
  private final int port;

  public Cluster(String name, int port) {
    this.name = "java_" + name;
    this.port = port;
  }

  /** The repository's root: the first directory above the working one with pg_test/cluster. */
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

  /** Destroys what a previous run left, creates and starts the cluster, creates pg_fence. */
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

  public int port() {
    return port;
  }

  public String url() {
    return "jdbc:postgresql://127.0.0.1:" + port + "/postgres";
  }

  /** A DataSource of new connections (no pool) whose sessions carry {@code applicationName}. */
  public PGSimpleDataSource dataSource(String applicationName) {
    return dataSource(applicationName, port);
  }

  /** As {@link #dataSource(String)}, to another port (a proxy's). */
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

  public Connection connect(String applicationName) throws SQLException {
    return dataSource(applicationName).getConnection();
  }

  /** The first column of the first row of {@code sql} with {@code params}, as a String. */
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

  /** Revokes the key's live lease (as a superuser). */
  public void revoke(String key) {
    sql("SELECT fence.lease_revoke(?)", key);
  }

  /** Ends every session of {@code applicationName} (pg_terminate_backend); how many. */
  public int terminate(String applicationName) {
    return Integer.parseInt(
        sql(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = ?",
            applicationName));
  }

  /** The backend pids of {@code applicationName}'s sessions. */
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

  public void start() {
    run("start", name);
  }

  public void stop() {
    run("stop", name);
  }

  /**
   * A signal to the postmaster and every process it started (STOP: the server stops answering, but
   * its kernel still accepts connections and acknowledges packets; CONT resumes it).
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
