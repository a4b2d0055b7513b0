package io.pgfence.testing;

import java.util.List;
import java.util.Map;

/** The scenarios of a behaviours file, and the cluster each runs on. */
public final class Scenarios {
  private Scenarios() {}

  /** What runs a scenario on a cluster. */
  @FunctionalInterface
  public interface Body {
    void run(Cluster cluster) throws Exception;
  }

  /** The scenarios of clients/behaviours/{@code file}. */
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
