package io.pgfence.spring.jdbc;

import io.pgfence.StaleFenceException;

/**
 * PF002 in Spring code: a guarded or fenced write under a fence that is no longer the key's live
 * one (another holder took the key). Nothing was written by the refused statement, and its
 * transaction is to be rolled back.
 */
public class StaleFenceDataAccessException extends FenceDataAccessException {
  private static final long serialVersionUID = 1L;

  /**
   * The exception of a refused statement.
   *
   * @param message what was refused, and where
   * @param cause the client's exception
   */
  public StaleFenceDataAccessException(String message, StaleFenceException cause) {
    super(message, cause);
  }

  /**
   * The fence the server refused.
   *
   * @return the stale fence; -1 when the server's message did not name it
   */
  public long fence() {
    return staleFence().fence();
  }

  /**
   * The key whose guard refused the fence.
   *
   * @return the key; null when the server's message did not name it ({@code fenced_write})
   */
  public String key() {
    return staleFence().key();
  }

  /**
   * The client's exception: the key and fence refused, when the server named them.
   *
   * @return the cause, typed
   */
  public StaleFenceException staleFence() {
    return (StaleFenceException) getCause();
  }
}
