package pgfence_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"pgfence.io/pgfence"
	"pgfence.io/pgfence/internal/pgtest"
)

// A plain Client.Acquire given up by its caller after its try was sent (here: granted while its
// reply hangs in a proxy) returns the context's error and leaves no grant behind: the client
// releases the token it chose in the background, so the key is free again within seconds, not
// at the TTL (issue 41's phantom grant, for the plain acquire).
func TestAGivenUpAcquireLeavesNoGrant(t *testing.T) {
	t.Parallel()
	c, k := keptCluster(t), key(t)
	holder := c.Client(t, "given_up_holder")
	held := must[*pgfence.Lease](t)(holder.Acquire(context.Background(), k, pgfence.AcquireOptions{TTL: 30 * time.Second}))
	proxy := pgtest.NewProxy(t, 0, c.Port)
	config := must[*pgxpool.Config](t)(pgfence.ParsePoolConfig(c.ConnString("given_up_waiter", proxy.Port())))
	pool := must[*pgxpool.Pool](t)(pgxpool.NewWithConfig(context.Background(), config))
	t.Cleanup(pool.Close)
	waiter := pgfence.NewClient(pool)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := waiter.Acquire(ctx, k, pgfence.AcquireOptions{TTL: 30 * time.Second, Wait: 20 * time.Second})
		done <- err
	}()
	eventually(t, 10*time.Second, "the acquire waits", func() bool { return c.SQL(t, "SELECT fence.waiters($1)", k) == "1" })
	proxy.HangExisting()
	if _, err := pgfence.Release(context.Background(), holder.Pool, held); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the waiter granted", func() bool {
		return c.SQL(t, "SELECT count(*) FROM fence.leases WHERE key = $1 AND live", k) == "1"
	})
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the given-up acquire ended with %v, not its cancellation", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the given-up acquire did not end")
	}
	eventually(t, 5*time.Second, "the given-up grant released", func() bool {
		return c.SQL(t, "SELECT count(*) FROM fence.leases WHERE key = $1 AND live", k) == "0"
	})
}
