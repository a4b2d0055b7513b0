package io.pgfence.spring.jdbc;

import io.pgfence.LeaseLostException;

/**
 * PF001 in Spring code: the lease the work ran under is no longer held (lost, expired, revoked).
 * Nothing was written by the refused statement, and its transaction is to be rolled back.
 */
public class LeaseLostDataAccessException extends FenceDataAccessException {
  private static final long serialVersionUID = 1L;

  /**
   * The exception of a refused statement.
   *
   * @param message what was refused, and where
   * @param cause the client's exception
   */
  public LeaseLostDataAccessException(String message, LeaseLostException cause) {
    super(message, cause);
  }

  /**
   * Why the lease was lost, when the client asked the server (a kept lease's guard).
   *
   * @return the reason; empty from a statement the server refused
   */
  public java.util.Optional<io.pgfence.LossReason> reason() {
    return leaseLost().reason();
  }

  /**
   * The client's exception: its key, and its loss reason when known.
   *
   * @return the cause, typed
   */
  public LeaseLostException leaseLost() {
    return (LeaseLostException) getCause();
  }
}
