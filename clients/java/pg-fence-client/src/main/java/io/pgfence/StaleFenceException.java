package io.pgfence;

/**
 * {@code PF002}: a guarded or fenced write under a fence that is not the key's live one (or lower
 * than the row's, for {@code fenced_write}). The write was refused, and nothing was written.
 */
public class StaleFenceException extends PgFenceException {
  private static final long serialVersionUID = 1L;

  /** The key whose guard refused the fence; null for {@code fenced_write}. */
  private final String key;

  /** The fence refused. */
  private final long fence;

  /**
   * A fence the server refused.
   *
   * @param key the key whose guard refused the fence; null for {@code fenced_write}
   * @param fence the fence refused
   * @param cause the server's error
   */
  public StaleFenceException(String key, long fence, Throwable cause) {
    super("stale fence " + fence + (key == null ? "" : " for key \"" + key + "\""), "PF002", cause);
    this.key = key;
    this.fence = fence;
  }

  /**
   * The key whose guard refused the fence.
   *
   * @return the key; null for {@code fenced_write}, which has no key
   */
  public String key() {
    return key;
  }

  /**
   * The fence refused.
   *
   * @return the fence the write carried
   */
  public long fence() {
    return fence;
  }
}
