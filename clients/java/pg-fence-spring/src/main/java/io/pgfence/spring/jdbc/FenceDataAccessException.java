package io.pgfence.spring.jdbc;

import io.pgfence.PgFenceException;
import org.springframework.dao.NonTransientDataAccessException;

/**
 * A pg_fence refusal (SQLSTATE class {@code PF}) as Spring's data access exceptions: {@link
 * LeaseLostDataAccessException} (PF001) or {@link StaleFenceDataAccessException} (PF002). Not
 * transient: a retry under the same lease or fence is refused again; the work must stop, or take
 * the lease anew. The cause is the client's own exception ({@link io.pgfence.LeaseLostException} or
 * {@link io.pgfence.StaleFenceException}), whose cause in turn is the driver's.
 */
public abstract class FenceDataAccessException extends NonTransientDataAccessException {
  private static final long serialVersionUID = 1L;

  /**
   * An exception with the client's exception as cause.
   *
   * @param message what was refused, and where
   * @param cause the client's exception
   */
  protected FenceDataAccessException(String message, PgFenceException cause) {
    super(message, cause);
  }

  /**
   * The client's exception.
   *
   * @return the cause, typed
   */
  public PgFenceException fenceException() {
    return (PgFenceException) getCause();
  }
}
