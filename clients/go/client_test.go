package pgfence_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"pgfence.io/pgfence"
	"pgfence.io/pgfence/internal/pgtest"
)

// The retrying client's cluster: lost replies, unknown outcomes.
var clientCluster = shared("client", 27731)

// viaProxy is the client tests' cluster, a proxy on port in front of it, and a client through it.
func viaProxy(t *testing.T, port int) (*pgtest.Cluster, *pgtest.Proxy, *pgfence.Client) {
	c := clientCluster(t)
	proxy := pgtest.NewProxy(t, port, c.Port)
	return c, proxy, c.Client(t, "lost_reply", proxy.Port())
}

// A reply lost after the server committed the grant (the proxy drops it and closes both sides):
// the retried acquire carries the same token and gets that very lease.
func TestALostReplyIsAnsweredByTheRetriedAcquire(t *testing.T) {
	t.Parallel()
	c, proxy, client := viaProxy(t, 27761)
	ctx, k := context.Background(), key(t)
	// The key travels in the acquire's Bind message only: the reply lost is the grant's.
	proxy.DropReplyAfter(k)
	lease, err := client.Acquire(ctx, k, pgfence.AcquireOptions{TTL: ttl})
	if err != nil || lease == nil {
		t.Fatalf("%+v, %v", lease, err)
	}
	if proxy.Dropped() != 1 {
		t.Fatalf("%d replies lost", proxy.Dropped())
	}
	if live := c.SQL(t, "SELECT fence FROM fence.leases WHERE key = $1 AND live", k); live != fmt.Sprint(lease.Fence) {
		t.Fatalf("the live fence is %s, the retry got %d", live, lease.Fence)
	}
	if n := c.SQL(t, "SELECT count(*) FROM fence.leases WHERE key = $1", k); n != "1" {
		t.Fatalf("%s leases", n)
	}
	if !must[bool](t)(client.Release(ctx, lease)) {
		t.Fatal("not released")
	}
}

// When every try's reply is lost, the unknown outcome carries the token, to release or ask about.
func TestAnUnknownOutcomeCarriesTheToken(t *testing.T) {
	t.Parallel()
	c, proxy, client := viaProxy(t, 27762)
	ctx, k := context.Background(), key(t)
	client.Backoff = pgfence.Backoff{Base: 10 * time.Millisecond, Cap: 50 * time.Millisecond, MaxAttempts: 3}
	proxy.DropEveryReply(true)
	proxy.DropReplyAfter(k)
	token := uuid.New()
	_, err := client.Acquire(ctx, k, pgfence.AcquireOptions{TTL: ttl, Token: token})
	var unknown *pgfence.OutcomeUnknownError
	if !errors.Is(err, pgfence.ErrOutcomeUnknown) || !errors.As(err, &unknown) || unknown.Token != token {
		t.Fatalf("%v", err)
	}
	if proxy.Dropped() != 3 {
		t.Fatalf("%d replies lost", proxy.Dropped())
	}
	check := c.Client(t, "lost_reply_check")
	if status := must[*pgfence.LeaseStatus](t)(check.Status(ctx, k, token)); !status.Live() {
		t.Fatalf("the first try granted it, yet %+v", status)
	}
	if !must[bool](t)(check.ReleaseToken(ctx, k, token)) {
		t.Fatal("the token does not release it")
	}
}

// Hold's acquire is retried with its token too.
func TestHoldRidesOutALostReply(t *testing.T) {
	t.Parallel()
	c, proxy, client := viaProxy(t, 27763)
	ctx, k := context.Background(), key(t)
	proxy.DropReplyAfter(k)
	kept, err := client.Hold(ctx, k, pgfence.HoldOptions{AcquireOptions: pgfence.AcquireOptions{TTL: ttl}})
	if err != nil {
		t.Fatal(err)
	}
	defer kept.Close()
	if proxy.Dropped() != 1 || c.SQL(t, "SELECT fence FROM fence.leases WHERE key = $1 AND live", k) != fmt.Sprint(kept.Fence()) {
		t.Fatalf("%d lost; kept %d", proxy.Dropped(), kept.Fence())
	}
}

// With nothing to connect to, the retries end in ErrNoConnection: nothing was sent.
func TestNoConnectionBeforeTheRetriesRanOut(t *testing.T) {
	t.Parallel()
	c := clientCluster(t)
	client := c.Client(t, "nobody", 27779)
	client.Backoff = pgfence.Backoff{MaxElapsed: 300 * time.Millisecond}
	_, err := client.Acquire(context.Background(), key(t), pgfence.AcquireOptions{TTL: ttl})
	if !errors.Is(err, pgfence.ErrNoConnection) || errors.Is(err, pgfence.ErrOutcomeUnknown) {
		t.Fatalf("%v", err)
	}
}

// kill -9 of the server: the client's calls are retried until it is back.
func TestTheClientRidesOutAKillOfTheServer(t *testing.T) {
	t.Parallel()
	c, ctx, k := pgtest.New(t, "crash", 27738), context.Background(), key(t)
	client := c.Client(t, "crash")
	lease := must[*pgfence.Lease](t)(client.Acquire(ctx, k, pgfence.AcquireOptions{TTL: ttl}))
	c.Crash(t)
	restarted := make(chan struct{})
	go func() {
		defer close(restarted)
		time.Sleep(time.Second)
		c.Start(t)
	}()
	renewed, err := client.Renew(ctx, lease, ttl)
	<-restarted
	if err != nil || !renewed.After(lease.ExpiresAt) {
		t.Fatalf("a durable lease renewed across kill -9: %v, %v", renewed, err)
	}
	if !must[bool](t)(client.Release(ctx, lease)) {
		t.Fatal("not released")
	}
}

// A session-bound acquire whose reply is lost while its backend lives on, cut off (a partition):
// the retry does not take that orphan's lease with the same token; it releases that token and
// takes a lease bound to its own session, which outlives the orphan.
func TestASessionBoundAcquireDoesNotTakeAnOrphanedBackendsLease(t *testing.T) {
	t.Parallel()
	c, proxy, client := viaProxy(t, 27764)
	ctx, k := context.Background(), key(t)
	proxy.Orphan()
	proxy.DropReplyAfter(k)
	// Retries that took the orphan's lease would find it bound elsewhere until its TTL: they end.
	client.Backoff = pgfence.Backoff{MaxElapsed: 5 * time.Second}
	opts := hold(ttl)
	opts.SessionBound = true
	kept, err := client.Hold(ctx, k, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer kept.Close()
	if proxy.Dropped() != 1 {
		t.Fatalf("%d replies lost", proxy.Dropped())
	}
	proxy.CloseOrphans()
	// Its own session holds it, not the orphan's, which has ended.
	time.Sleep(500 * time.Millisecond)
	if !kept.IsHeld() {
		t.Fatalf("lost with the orphan: %s", kept.Reason())
	}
	if live := c.SQL(t, "SELECT fence FROM fence.leases WHERE key = $1 AND live", k); live != fmt.Sprint(kept.Fence()) {
		t.Fatalf("the live fence is %s, kept %d", live, kept.Fence())
	}
}
