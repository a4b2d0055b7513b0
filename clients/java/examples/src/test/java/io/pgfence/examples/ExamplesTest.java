package io.pgfence.examples;

import static org.junit.jupiter.api.Assertions.assertTrue;

import io.pgfence.testing.Cluster;
import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** Runs the three examples against a real server and checks what they print. */
class ExamplesTest {
  private static Cluster cluster;
  private static String url;

  @BeforeAll
  static void create() {
    cluster = new Cluster("examples", 27840).create();
    url = cluster.url() + "?user=postgres";
  }

  @AfterAll
  static void destroy() {
    cluster.destroy();
  }

  /** What {@code main} printed (also echoed, for the log). */
  private interface Main {
    void run(String[] args) throws Throwable;
  }

  private static String run(Main main) throws Throwable {
    PrintStream out = System.out;
    ByteArrayOutputStream captured = new ByteArrayOutputStream();
    System.setOut(new PrintStream(captured, true, StandardCharsets.UTF_8));
    try {
      main.run(new String[] {url});
    } finally {
      System.setOut(out);
    }
    String printed = captured.toString(StandardCharsets.UTF_8);
    System.out.print(printed);
    return printed;
  }

  private static long number(String printed, String regex) {
    Matcher matcher = Pattern.compile(regex).matcher(printed);
    assertTrue(matcher.find(), "no " + regex + " in:\n" + printed);
    return Long.parseLong(matcher.group(1));
  }

  @Test
  void singletonJob() throws Throwable {
    String printed = run(SingletonJob::main);
    assertTrue(printed.contains("ticks 5: runs 5, skipped 10"), printed);
    assertTrue(printed.contains("another instance ran the job meanwhile: true"), printed);
    assertTrue(number(printed, "stale writes refused (\\d+)") == 1, printed);
  }

  @Test
  void invoiceWorkers() throws Throwable {
    String printed = run(InvoiceWorkers::main);
    assertTrue(printed.contains("invoices finished 5 of 5"), printed);
    assertTrue(number(printed, "leases told lost (\\d+)") >= 1, printed);
    assertTrue(printed.contains("lost (revoked)"), printed);
  }

  @Test
  void leaderElection() throws Throwable {
    String printed = run(LeaderElection::main);
    assertTrue(printed.contains("leaders elected 3"), printed);
    assertTrue(number(printed, "revoked node-\\d: node-\\d elected (\\d+) ms later") < 10_000);
  }
}
