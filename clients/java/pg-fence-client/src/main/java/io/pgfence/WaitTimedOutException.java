package io.pgfence;

/** A kept lease ({@link FenceClient#hold}) was not granted within its {@code wait}. */
public class WaitTimedOutException extends PgFenceException {
  private static final long serialVersionUID = 1L;

  /**
   * A kept lease not granted within its wait.
   *
   * @param key the key not granted
   */
  public WaitTimedOutException(String key) {
    super("not granted within the wait: " + key, null, null);
  }
}
