package io.pgfence;

import java.util.Optional;
import java.util.UUID;

/**
 * The connection broke or hung mid-call (or the server ended the session) after a try that may have
 * taken effect, and the retries ran out: the server may or may not have done it. For an acquire,
 * {@link #token()} is the token every try carried: a lease it may have granted is that token's, to
 * be released ({@link FenceClient#releaseToken}) or asked about ({@link FenceClient#status}).
 */
public class OutcomeUnknownException extends PgFenceException {
  private static final long serialVersionUID = 1L;

  private final transient UUID token;

  /**
   * A call whose outcome is unknown.
   *
   * @param message what was being done
   * @param token the acquire's token; null for other calls
   * @param cause the last try's error
   */
  public OutcomeUnknownException(String message, UUID token, Throwable cause) {
    super(message, cause instanceof java.sql.SQLException e ? e.getSQLState() : null, cause);
    this.token = token;
  }

  /**
   * The token of the acquire whose outcome is unknown.
   *
   * @return the token every try carried; empty for other calls
   */
  public Optional<UUID> token() {
    return Optional.ofNullable(token);
  }
}
