package io.pgfence;

import java.time.Instant;
import java.util.Optional;

/**
 * {@code fence.lease_status(key, token)}: whether the lease a token was granted on a key is live,
 * and if not, why it ended.
 *
 * @param state {@code live} or {@code ended}
 * @param reason the server's word for why it ended ({@code released}, {@code expired}, {@code
 *     revoked}, {@code taken_over}, {@code session_ended}, {@code unknown}); null while live
 * @param fence the lease's fence; null when the server knows nothing of the token
 * @param expiresAt its expiry, or when it ended; null when unknown
 * @param currentFence the key's last fence, as {@code current_fence}
 */
public record LeaseStatus(
    String state, String reason, Long fence, Instant expiresAt, Long currentFence) {

  /**
   * Whether the token still holds the key's live lease.
   *
   * @return true when {@code state} is {@code live}
   */
  public boolean isLive() {
    return "live".equals(state);
  }

  /**
   * Why the lease was lost, as a {@link LossReason}; empty while live and when its holder released
   * it. {@code unknown} of a fast lease ({@code durable} false) is {@link LossReason#RESTARTED}.
   *
   * @param durable whether the lease was granted durable, which tells what {@code unknown} means
   * @return the reason; empty while live and after a release
   */
  public Optional<LossReason> lossReason(boolean durable) {
    return isLive() ? Optional.empty() : Optional.ofNullable(LossReason.ofStatus(reason, durable));
  }
}
