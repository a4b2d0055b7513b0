package pgfence_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"pgfence.io/pgfence"
	"pgfence.io/pgfence/internal/pgtest"
)

// Acquire and release latency, p50 and p99: one statement on one connection (durable and fast
// leases), and through the Client over a pool. Printed, not judged (but for a sanity bound). Not
// parallel: it runs before the package's other tests start, so that they do not share its
// server's WAL flushes.
func TestLatency(t *testing.T) {
	c, ctx := pgtest.New(t, "latency", 27737), context.Background()
	conn := c.Conn(t, "latency")
	onConn := func(opts pgfence.AcquireOptions) func(string) (func() (bool, error), error) {
		return func(k string) (func() (bool, error), error) {
			lease, err := pgfence.Acquire(ctx, conn, k, opts)
			if err != nil || lease == nil {
				return nil, fmt.Errorf("%+v, %v", lease, err)
			}
			return func() (bool, error) { return pgfence.Release(ctx, conn, lease) }, nil
		}
	}
	measure(t, "one connection, durable", onConn(pgfence.AcquireOptions{TTL: ttl}))
	measure(t, "one connection, fast", onConn(pgfence.AcquireOptions{TTL: ttl, Fast: true}))
	client := c.Client(t, "latency_pool")
	measure(t, "Client over pgxpool, durable", func(k string) (func() (bool, error), error) {
		lease, err := client.Acquire(ctx, k, pgfence.AcquireOptions{TTL: ttl})
		if err != nil || lease == nil {
			return nil, fmt.Errorf("%+v, %v", lease, err)
		}
		return func() (bool, error) { return client.Release(ctx, lease) }, nil
	})
}

// measure times 500 acquires and releases of keys of their own, after 50 that warm up the
// server's plans and the connection's statement cache.
func measure(t *testing.T, what string, acquire func(key string) (func() (bool, error), error)) {
	const samples, warmup = 500, 50
	var acquires, releases []time.Duration
	for i := range samples + warmup {
		start := time.Now()
		release, err := acquire(fmt.Sprintf("%s:%d", what, i))
		if err != nil {
			t.Fatal(err)
		}
		acquired := time.Now()
		if ok, err := release(); !ok || err != nil {
			t.Fatalf("release: %v, %v", ok, err)
		}
		if i >= warmup {
			acquires, releases = append(acquires, acquired.Sub(start)), append(releases, time.Since(acquired))
		}
	}
	fmt.Printf("[latency] %s: acquire %s; release %s\n", what, pgtest.Percentiles(acquires), pgtest.Percentiles(releases))
	if pgtest.Millis(acquires, 50) > 1000 {
		t.Fatal("a sanity bound")
	}
}
