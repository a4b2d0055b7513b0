package io.pgfence;

import java.time.Instant;
import java.util.Comparator;
import java.util.List;
import java.util.OptionalLong;
import java.util.UUID;
import java.util.stream.Collectors;

/**
 * What {@code lease_acquire_all} granted: one lease per key, in key order, each with its own fence,
 * all sharing one token; renewed and released together.
 *
 * @param leases the leases, in key order
 * @param token the token they share
 */
public record LeaseSet(List<Lease> leases, UUID token) {

  /**
   * A set of {@code leases}, copied.
   *
   * @param leases the leases, in key order; copied, so later changes to the list are not seen
   * @param token the token they share
   */
  public LeaseSet {
    leases = List.copyOf(leases);
  }

  /**
   * The keys, in key order.
   *
   * @return a new list of the set's keys
   */
  public List<String> keys() {
    return leases.stream().map(Lease::key).collect(Collectors.toList());
  }

  /**
   * The fence of the set's lease on {@code key}.
   *
   * @param key one of the set's keys
   * @return its lease's fence; empty for a key outside the set
   */
  public OptionalLong fence(String key) {
    return leases.stream()
        .filter(lease -> lease.key().equals(key))
        .mapToLong(Lease::fence)
        .findFirst();
  }

  /**
   * The earliest expiry of the set's leases.
   *
   * @return the server's earliest expiry: the set is whole until then, short of a renewal
   */
  public Instant expiresAt() {
    return leases.stream().map(Lease::expiresAt).min(Comparator.naturalOrder()).orElseThrow();
  }

  /**
   * The keys, comma-separated, as exceptions name a set.
   *
   * @return the keys in key order, joined by {@code ", "}
   */
  public String label() {
    return String.join(", ", keys());
  }
}
