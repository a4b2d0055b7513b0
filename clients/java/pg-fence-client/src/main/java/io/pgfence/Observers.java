package io.pgfence;

import java.time.Duration;
import java.util.concurrent.CopyOnWriteArrayList;

/**
 * A client's observers, told in turn; one that throws (an Error too, but the JVM's own) is skipped,
 * the others are still told. Told with no lock of the client held: a slow observer holds up its
 * thread only.
 */
final class Observers implements FenceObserver {
  private final CopyOnWriteArrayList<FenceObserver> list = new CopyOnWriteArrayList<>();

  void add(FenceObserver observer) {
    list.addIfAbsent(observer);
  }

  boolean remove(FenceObserver observer) {
    return list.remove(observer);
  }

  /** Whether any observer listens: the callers skip measuring when none does. */
  boolean any() {
    return !list.isEmpty();
  }

  private interface Call {
    void tell(FenceObserver observer);
  }

  private void each(Call call) {
    for (FenceObserver observer : list) {
      Callbacks.run(() -> call.tell(observer));
    }
  }

  @Override
  public void acquireFinished(Duration took, AcquireOutcome outcome) {
    each(o -> o.acquireFinished(took, outcome));
  }

  @Override
  public void renewFinished(Duration took, RenewOutcome outcome, int leases) {
    each(o -> o.renewFinished(took, outcome, leases));
  }

  @Override
  public void keptLeaseStarted(KeptLease lease) {
    each(o -> o.keptLeaseStarted(lease));
  }

  @Override
  public void keptLeaseEnded(KeptLease lease) {
    each(o -> o.keptLeaseEnded(lease));
  }

  @Override
  public void leaseLost(KeptLease lease, LossReason reason) {
    each(o -> o.leaseLost(lease, reason));
  }

  @Override
  public void leadershipGained(String election) {
    each(o -> o.leadershipGained(election));
  }

  @Override
  public void leadershipLost(String election) {
    each(o -> o.leadershipLost(election));
  }
}
