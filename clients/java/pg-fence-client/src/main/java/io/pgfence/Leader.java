package io.pgfence;

import java.time.Instant;
import java.util.Objects;

/**
 * A key's leader as observers see it: the fence and owner of its live lease. Two leaders are equal
 * when their fence and owner are.
 *
 * @param fence the leader's fence
 * @param owner its value: the owner it was granted with, or last proclaimed
 * @param acquiredAt when it was granted
 * @param expiresAt when it expires, short of a renewal
 */
public record Leader(long fence, String owner, Instant acquiredAt, Instant expiresAt) {

  @Override
  public boolean equals(Object other) {
    return other instanceof Leader leader && leader.fence == fence && leader.owner.equals(owner);
  }

  @Override
  public int hashCode() {
    return Objects.hash(fence, owner);
  }
}
