package pgfence_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"pgfence.io/pgfence"
	"pgfence.io/pgfence/internal/pgtest"
)

// The review's cluster and proxies keep to ports 27780-27799, apart from the rest of the suite.
var reviewCluster = shared("review", 27780)

// A session-bound Hold draws a fresh token for each retry (the last try's grant would be bound to
// an orphaned backend): when every try's outcome is unknown, the lease that may be held is the
// last try's, so that is the token to carry, and to release before Hold returns.
func TestASessionBoundHoldWhoseRetriesRanOutLeavesNothingHeld(t *testing.T) {
	t.Parallel()
	c := reviewCluster(t)
	proxy := pgtest.NewProxy(t, 27781, c.Port)
	t.Cleanup(proxy.CloseOrphans)
	client := c.Client(t, "review_bound", proxy.Port())
	ctx, k := context.Background(), key(t)
	// The owner travels in the acquire only, not in the releases between the tries.
	owner := "owner-" + k
	proxy.Orphan()
	proxy.DropEveryReply(true)
	proxy.DropReplyAfter(owner)
	client.Backoff = pgfence.Backoff{Base: 10 * time.Millisecond, Cap: 50 * time.Millisecond, MaxAttempts: 3}
	opts := hold(ttl)
	opts.SessionBound, opts.Owner = true, owner
	_, err := client.Hold(ctx, k, opts)
	var unknown *pgfence.OutcomeUnknownError
	if !errors.As(err, &unknown) {
		t.Fatalf("%v", err)
	}
	if proxy.Dropped() < 2 {
		t.Fatalf("%d replies lost: no retry", proxy.Dropped())
	}
	if live := c.SQL(t, "SELECT count(*) FROM fence.leases WHERE key = $1 AND live", k); live != "0" {
		fence := c.SQL(t, "SELECT fence FROM fence.leases WHERE key = $1 AND live", k)
		t.Fatalf("%s live lease left held behind the error (fence %s; the error carries token %s)", live, fence, unknown.Token)
	}
	check := c.Client(t, "review_bound_check")
	if status := must[*pgfence.LeaseStatus](t)(check.Status(ctx, k, unknown.Token)); status.Fence == 0 || status.Fence != status.CurrentFence {
		t.Fatalf("the error's token is not the last grant's: %+v", status)
	}
}
