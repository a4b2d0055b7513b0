package pgfence_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"pgfence.io/pgfence"
	"pgfence.io/pgfence/internal/pgtest"
)

// These edge cases (hung calls, callbacks that close or resign, a lost release reply) keep to
// ports 27780-27799.
var edgesCluster = shared("edges", 27780)

// edgesProxy is their cluster, a proxy on port in front of it, and a client through it
// that tries each call once (the tests that lose replies set their own backoff).
func edgesProxy(t *testing.T, port int, app string) (*pgtest.Cluster, *pgtest.Proxy, *pgfence.Client) {
	c := edgesCluster(t)
	proxy := pgtest.NewProxy(t, port, c.Port)
	client := c.Client(t, app, proxy.Port())
	client.Backoff = pgfence.Backoff{MaxAttempts: 1}
	return c, proxy, client
}

// toldByTheDeadline fails unless held ends within 500 ms of the deadline, before the call that
// hangs (ended) gives up; then waits for that call.
func toldByTheDeadline(t *testing.T, held <-chan struct{}, deadline time.Time, ended <-chan error) {
	t.Helper()
	select {
	case <-held:
		if late := time.Since(deadline); late > 500*time.Millisecond {
			t.Errorf("told %v after the deadline", late)
		}
	case err := <-ended:
		t.Fatalf("the call ended first (%v), the lease told held %v past its deadline", err, time.Since(deadline))
	}
	<-ended
}

// A session-bound Hold draws a fresh token for each retry (the last try's grant would be bound to
// an orphaned backend): when every try's outcome is unknown, the lease that may be held is the
// last try's, so that is the token to carry, and to release before Hold returns.
func TestASessionBoundHoldWhoseRetriesRanOutLeavesNothingHeld(t *testing.T) {
	t.Parallel()
	c, proxy, client := edgesProxy(t, 27781, "edges_bound")
	t.Cleanup(proxy.CloseOrphans)
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
	check := c.Client(t, "edges_bound_check")
	if status := must[*pgfence.LeaseStatus](t)(check.Status(ctx, k, unknown.Token)); status.Fence == 0 || status.Fence != status.CurrentFence {
		t.Fatalf("the error's token is not the last grant's: %+v", status)
	}
}

// A proclaim holds the keeper's renewal lock for as long as it takes: the keeper waiting for that
// lock must still end the leadership at its local deadline, not when the proclaim gives up.
func TestAHungProclaimDoesNotKeepALeaderPastItsDeadline(t *testing.T) {
	t.Parallel()
	_, proxy, client := edgesProxy(t, 27782, "edges_proclaim")
	client.CallTimeout = 6 * time.Second
	ctx, k := context.Background(), key(t)
	cfg := electorConfig(k, "node-a", 2*time.Second)
	elector := must[*pgfence.Elector](t)(pgfence.NewElector(client, cfg))
	l := must[*pgfence.Leadership](t)(elector.Campaign(ctx))
	// A connection in the pool for the proclaim to take, which then hangs with the keeper's.
	must[int64](t)(client.CurrentFence(ctx, k))
	proxy.HangExisting()
	proclaimed := make(chan error, 1)
	go func() { proclaimed <- l.Proclaim(ctx, "node-a again") }()
	toldByTheDeadline(t, l.Context().Done(), l.Kept().Deadline(), proclaimed)
}

// A release whose reply is lost after the server ended the lease is retried, and the retry finds
// the token holding nothing: this call still ended the lease, so true, not "it held nothing".
func TestAReleaseWhoseReplyWasLostSaysItReleased(t *testing.T) {
	t.Parallel()
	_, proxy, client := edgesProxy(t, 27783, "edges_release")
	client.Backoff = pgfence.Backoff{}
	ctx, k := context.Background(), key(t)
	lease := must[*pgfence.Lease](t)(client.Acquire(ctx, k, pgfence.AcquireOptions{TTL: ttl}))
	proxy.DropReplyAfter(k)
	released, err := client.Release(ctx, lease)
	if err != nil || proxy.Dropped() != 1 {
		t.Fatalf("%v; %d replies lost", err, proxy.Dropped())
	}
	if !released {
		status := must[*pgfence.LeaseStatus](t)(client.Status(ctx, k, lease.Token))
		t.Fatalf("false, yet this release ended it: %+v", status)
	}
}

// Close stops the keeper, then releases: while that release hangs (a dead route), the lease's
// Context must still end at the local deadline, as it would have with the keeper running, not
// when the release gives up.
func TestAHungReleaseDoesNotKeepTheLeaseHeldPastItsDeadline(t *testing.T) {
	t.Parallel()
	kept, held, closed := closingOnAHungRoute(t, 27784, 2*time.Second, 5*time.Second)
	toldByTheDeadline(t, held.Done(), kept.Deadline(), closed)
}

// closingOnAHungRoute holds a lease through a proxy, takes its Context, hangs the route and closes
// the lease in the background: Close's answer comes on the channel.
func closingOnAHungRoute(t *testing.T, port int, ttl, timeout time.Duration) (*pgfence.KeptLease, context.Context, chan error) {
	_, proxy, client := edgesProxy(t, port, "edges_hung_release")
	opts := hold(ttl)
	opts.Timeout = timeout
	kept := must[*pgfence.KeptLease](t)(client.Hold(context.Background(), key(t), opts))
	held := kept.Context()
	proxy.HangExisting()
	closed := make(chan error, 1)
	go func() { closed <- kept.Close() }()
	return kept, held, closed
}

// OnLost is called from the keeper; closing the kept lease there, the natural clean-up, must not
// wait for the keeper to end, which waits for OnLost.
func TestClosingAKeptLeaseInOnLostReturns(t *testing.T) {
	t.Parallel()
	c, k := edgesCluster(t), key(t)
	var kept *pgfence.KeptLease
	closed := make(chan error, 1)
	opts := hold(1500 * time.Millisecond)
	opts.OnLost = func(error) { closed <- kept.Close() }
	kept = must[*pgfence.KeptLease](t)(c.Client(t, "edges_onlost").Hold(context.Background(), k, opts))
	c.Revoke(t, k)
	select {
	case err := <-closed:
		if err != nil || kept.Reason() != pgfence.ReasonRevoked {
			t.Fatalf("%v, %s", err, kept.Reason())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close in OnLost did not return")
	}
}

// Resigning in OnStoppedLeading (a clean-up that does not know the leadership already ended) must
// not wait for OnStoppedLeading to return.
func TestResigningInOnStoppedLeadingReturns(t *testing.T) {
	t.Parallel()
	c, k := edgesCluster(t), key(t)
	var elector *pgfence.Elector
	resigned := make(chan error, 1)
	cfg := electorConfig(k, "node-a", 2*time.Second)
	cfg.Callbacks.OnStoppedLeading = func() {
		_, err := elector.Leadership().Resign(context.Background())
		resigned <- err
	}
	elector = must[*pgfence.Elector](t)(pgfence.NewElector(c.Client(t, "edges_resign"), cfg))
	must[*pgfence.Leadership](t)(elector.Campaign(context.Background()))
	c.Revoke(t, k)
	select {
	case err := <-resigned:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Resign in OnStoppedLeading did not return")
	}
}

// Once the release is sent, the server may end the lease and grant the key to a waiter at once:
// the lease is no longer told held while the release's answer is awaited.
func TestALeaseIsNotToldHeldWhileItsReleaseIsAnswered(t *testing.T) {
	t.Parallel()
	kept, held, closed := closingOnAHungRoute(t, 27785, 10*time.Second, 2*time.Second)
	time.Sleep(300 * time.Millisecond)
	if kept.IsHeld() || held.Err() == nil {
		t.Errorf("told held while its release is in flight (state %s)", kept.State())
	}
	<-closed
}
