package io.pgfence.testing;

import java.util.Arrays;

/** p50 and p99 of measured durations, in milliseconds, for the figures the suites print. */
public final class Percentiles {
  private Percentiles() {}

  /**
   * The {@code p}-th percentile (nearest rank) of {@code nanos}, in milliseconds.
   *
   * @param nanos the measured durations in nanoseconds, in any order; not empty (left unsorted)
   * @param p the percentile, 0 to 100
   * @return the percentile in milliseconds
   */
  public static double millis(long[] nanos, double p) {
    long[] sorted = nanos.clone();
    Arrays.sort(sorted);
    int rank = (int) Math.ceil(p / 100.0 * sorted.length);
    return sorted[Math.max(0, Math.min(sorted.length - 1, rank - 1))] / 1e6;
  }

  /**
   * "p50 X ms, p99 Y ms (n samples)".
   *
   * @param nanos the measured durations in nanoseconds, in any order; not empty
   * @return the summary, with two decimals
   */
  public static String summary(long[] nanos) {
    return String.format(
        "p50 %.2f ms, p99 %.2f ms (%d samples)",
        millis(nanos, 50), millis(nanos, 99), nanos.length);
  }
}
