package pgfence_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"pgfence.io/pgfence"
)

// Kept leases beyond the behaviours: options, a wait that runs out, sets.
var keptCluster = shared("kept", 27739)

func hold(ttl time.Duration) pgfence.HoldOptions {
	return pgfence.HoldOptions{AcquireOptions: pgfence.AcquireOptions{TTL: ttl}}
}

func TestHoldRefusesOptionsThatCannotWorkBeforeSendingAnything(t *testing.T) {
	t.Parallel()
	client := keptCluster(t).Client(t, "kept")
	for _, bad := range []pgfence.HoldOptions{
		{AcquireOptions: pgfence.AcquireOptions{TTL: 3 * time.Second}, RenewEvery: 3 * time.Second},
		{AcquireOptions: pgfence.AcquireOptions{TTL: 0}},
		{AcquireOptions: pgfence.AcquireOptions{TTL: ttl, Shared: true, Permits: 2}},
	} {
		if _, err := client.Hold(context.Background(), key(t), bad); !errors.Is(err, pgfence.ErrInvalidOptions) {
			t.Fatalf("%+v: %v", bad, err)
		}
	}
}

func TestHoldNotGrantedWithinItsWait(t *testing.T) {
	t.Parallel()
	c, ctx, k := keptCluster(t), context.Background(), key(t)
	client := c.Client(t, "kept")
	first := must[*pgfence.KeptLease](t)(client.Hold(ctx, k, hold(ttl)))
	defer first.Close()
	opts := hold(ttl)
	opts.Wait = 200 * time.Millisecond
	if _, err := client.Hold(ctx, k, opts); !errors.Is(err, pgfence.ErrWaitTimedOut) {
		t.Fatalf("%v", err)
	}
	// A caller who gives up leaves nothing granted: the wait is cancelled on the server.
	ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	opts.Wait = time.Minute
	if _, err := client.Hold(ctx, k, opts); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%v", err)
	}
	eventually(t, 5*time.Second, "no waiter left", func() bool { return c.SQL(t, "SELECT fence.waiters($1)", k) == "0" })
	if released := must[bool](t)(first.Release(context.Background())); !released || first.State() != pgfence.StateReleased {
		t.Fatalf("released %v, %s", released, first.State())
	}
	if cause := context.Cause(first.Context()); !errors.Is(cause, pgfence.ErrReleased) {
		t.Fatalf("cause %v", cause)
	}
}

func TestAKeptSetIsRenewedAsOneGuardedPerKeyAndLostAsAWhole(t *testing.T) {
	t.Parallel()
	c, ctx, k := keptCluster(t), context.Background(), key(t)
	client := c.Client(t, "kept")
	opts := hold(3 * time.Second)
	lost := make(chan error, 1)
	opts.OnLost = func(cause error) { lost <- cause }
	keys := []string{k + ":b", k + ":a"}
	set := must[*pgfence.KeptLease](t)(client.HoldAll(ctx, keys, opts))
	defer set.Close()
	time.Sleep(3500 * time.Millisecond)
	conn := c.Conn(t, "kept_writer")
	tx := must[pgxTx](t)(conn.Begin(ctx))
	for _, key := range keys {
		if err := set.GuardKey(ctx, tx, key); err != nil {
			t.Fatalf("%s past its ttl: %v", key, err)
		}
	}
	_ = tx.Commit(ctx)
	c.Revoke(t, k+":a")
	select {
	case cause := <-lost:
		var lostErr *pgfence.LeaseLostError
		if !errors.As(cause, &lostErr) || lostErr.Reason != pgfence.ReasonRevoked {
			t.Fatalf("%v", cause)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("not told")
	}
	// The keeper releases the rest of the set at once: its other key is free long before its TTL
	// (renewed at most a third of it ago) would have freed it.
	eventually(t, time.Second, "the other key freed", func() bool {
		return c.SQL(t, "SELECT count(*) FROM fence.leases WHERE key = $1 AND live", k+":b") == "0"
	})
	if _, err := client.HoldAll(ctx, keys, pgfence.HoldOptions{AcquireOptions: pgfence.AcquireOptions{TTL: ttl, Permits: 2}}); !errors.Is(err, pgfence.ErrInvalidOptions) {
		t.Fatalf("a set with permits: %v", err)
	}
}
