package io.pgfence.spring.jdbc;

import io.pgfence.PgFence;
import java.sql.Connection;
import java.sql.SQLException;

/**
 * The guard of one lease, run first on a transaction's connection: {@code KeptLease::guard}, a
 * registry lock's {@code lock::guard}, or {@link #of(String, long)} for a key and fence.
 */
@FunctionalInterface
public interface ConnectionGuard {
  /**
   * Guards the transaction of {@code conn}: returns when the lease's fence is the key's live one,
   * and holds back every grant of a higher fence until that transaction ends.
   *
   * @param conn the transaction's connection (not autocommit)
   * @throws SQLException PF002 ({@link io.pgfence.StaleFenceException}) when the fence is stale,
   *     PF001 ({@link io.pgfence.LeaseLostException}) when the lease is known lost
   */
  void guard(Connection conn) throws SQLException;

  /**
   * The guard of {@code fence} on {@code key}: {@link PgFence#fenceGuard}.
   *
   * @param key the lease key
   * @param fence the fence the lease was granted
   * @return the guard
   */
  static ConnectionGuard of(String key, long fence) {
    return conn -> PgFence.fenceGuard(conn, key, fence);
  }
}
