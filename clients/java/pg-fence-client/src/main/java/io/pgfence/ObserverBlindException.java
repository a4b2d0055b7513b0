package io.pgfence;

/**
 * An observer could not reach the server for as long as the observed lease can live (the elector's
 * TTL) since the server last answered it: what it saw last may be over by now, and it cannot tell
 * (neither a vacancy, nor the old leader still leading). Thrown by {@link Elector.Observer#next()};
 * the next call reconnects and goes on.
 */
public class ObserverBlindException extends PgFenceException {
  private static final long serialVersionUID = 1L;

  ObserverBlindException(String key, Throwable cause) {
    super(
        "cannot see " + key + ": no answer from the server within the lease's TTL", "08006", cause);
  }
}
