package io.pgfence.examples.boot;

import io.pgfence.spring.jdbc.FencedTransactions;
import io.pgfence.spring.support.FencedLockRegistrySupport;
import io.pgfence.spring.support.FencedLockSupport;
import org.springframework.beans.factory.annotation.Value;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.scheduling.annotation.Scheduled;
import org.springframework.stereotype.Component;

/**
 * The scheduled job: every {@code report.every} (10 s by default) each instance tries the lock
 * {@code report}; the one that holds it writes a row in {@code report_runs} in a fenced
 * transaction, which commits only while its lease is the key's live one. The others skip this
 * round.
 */
@Component
public class ReportJob {
  private final FencedLockRegistrySupport<?> registry;
  private final FencedTransactions fenced;
  private final JdbcTemplate jdbc;
  private final String instance;

  /**
   * The job, from the auto-configured beans.
   *
   * @param registry the starter's lock registry (either Spring Integration line's)
   * @param fenced the starter's fenced transactions
   * @param jdbc Boot's JdbcTemplate, whose PF001/PF002 errors arrive typed
   * @param instance {@code report.instance}: who writes, for the rows
   */
  public ReportJob(
      FencedLockRegistrySupport<?> registry,
      FencedTransactions fenced,
      JdbcTemplate jdbc,
      @Value("${report.instance:instance}") String instance) {
    this.registry = registry;
    this.fenced = fenced;
    this.jdbc = jdbc;
    this.instance = instance;
  }

  /**
   * One round: the lock, then the fenced write, then the release. A {@code
   * StaleFenceDataAccessException} here means another instance took the key meanwhile: nothing was
   * written, and the next round tries again.
   */
  @Scheduled(fixedDelayString = "${report.every:10s}")
  public void run() {
    FencedLockSupport lock = registry.obtain("report");
    if (!lock.tryLock()) {
      return;
    }
    try {
      fenced.executeWithoutResult(
          lock::guard,
          status ->
              jdbc.update(
                  "INSERT INTO report_runs (fence, instance) VALUES (?, ?)",
                  lock.fence().getAsLong(),
                  instance));
    } finally {
      lock.unlock();
    }
  }
}
