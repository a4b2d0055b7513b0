package io.pgfence;

import io.pgfence.testing.Cluster;
import io.pgfence.testing.Scenarios;
import java.util.Map;
import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicTest;

/** The scenarios of a behaviours file as JUnit dynamic tests, one each. */
final class ScenarioTests {
  private ScenarioTests() {}

  /** Runs one scenario on the cluster it was given. */
  @FunctionalInterface
  interface Runner {
    void run(Cluster cluster, Map<String, Object> scenario) throws Exception;
  }

  /**
   * Each scenario of clients/behaviours/{@code file}, run on {@code shared}, or on a cluster of its
   * own ({@code ownName}, {@code ownPort}) when it crashes the server (see {@link Scenarios#run}).
   */
  static Stream<DynamicTest> of(
      String file, Cluster shared, String ownName, int ownPort, Runner runner) {
    return Scenarios.of(file).stream()
        .map(
            scenario ->
                DynamicTest.dynamicTest(
                    (String) scenario.get("name"),
                    () ->
                        Scenarios.run(
                            scenario, shared, ownName, ownPort, own -> runner.run(own, scenario))));
  }
}
