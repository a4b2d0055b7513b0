package io.pgfence.testing;

import java.util.List;
import java.util.Map;

/** The scenarios of a behaviours file, and the cluster each runs on. */
public final class Scenarios {
  private Scenarios() {}

  /** What runs a scenario on a cluster. */
  @FunctionalInterface
  public interface Body {
    /**
     * Runs the scenario on {@code cluster}.
     *
     * @param cluster the running cluster to run it on
     * @throws Exception what the scenario threw: the test fails with it
     */
    void run(Cluster cluster) throws Exception;
  }

  /**
   * The scenarios of clients/behaviours/{@code file}.
   *
   * @param file the behaviours file's name ({@code keeper.json})
   * @return its {@code scenarios} array, each an object
   */
  public static List<Map<String, Object>> of(String file) {
    return JsonData.asList(JsonData.behaviours(file).get("scenarios")).stream()
        .map(JsonData::asMap)
        .toList();
  }

  /**
   * Runs {@code body} on {@code shared}, or, for a scenario that crashes the server, on a cluster
   * of its own ({@code name}, {@code port}): after a crash that reset the fast leases, the first
   * grant waits for the clock to pass their reservation (up to 10 s), which would hold up the next
   * scenario.
   *
   * @param scenario the scenario, whose {@code steps} say whether it crashes the server
   * @param shared the cluster the other scenarios share
   * @param name the own cluster's name, for a scenario that crashes the server
   * @param port the own cluster's port, from the suite's range in CONTRIBUTING.md's ports table
   * @param body what runs the scenario
   * @throws Exception what {@code body} threw
   */
  public static void run(
      Map<String, Object> scenario, Cluster shared, String name, int port, Body body)
      throws Exception {
    boolean crashes =
        JsonData.asList(scenario.get("steps")).stream()
            .anyMatch(step -> JsonData.asMap(step).containsKey("crash_server"));
    if (!crashes) {
      body.run(shared);
      return;
    }
    Cluster own = new Cluster(name, port).create();
    try {
      body.run(own);
    } finally {
      own.destroy();
    }
  }
}
