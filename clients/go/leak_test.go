package pgfence_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"pgfence.io/pgfence"
)

// Kept leases, set and session-bound ones, and electors leave no goroutine behind once closed or
// cancelled.
func TestNothingIsLeftRunningAfterCloseAndCancel(t *testing.T) {
	c := edgesCluster(t)
	client := c.Client(t, "edges_leak")
	ctx, k := context.Background(), key(t)
	must[int64](t)(client.CurrentFence(ctx, k))
	before := runtime.NumGoroutine()
	for _, bound := range []bool{false, true} {
		opts := hold(2 * time.Second)
		opts.SessionBound = bound
		kept := must[*pgfence.KeptLease](t)(client.Hold(ctx, k, opts))
		if err := kept.Close(); err != nil || kept.Close() != nil {
			t.Fatal(err)
		}
	}
	set := must[*pgfence.KeptLease](t)(client.HoldAll(ctx, []string{k + "a", k + "b"}, hold(2*time.Second)))
	set.Close()
	cfg := electorConfig(k, "node-a", 2*time.Second)
	cfg.Callbacks = pgfence.LeaderCallbacks{
		OnStartedLeading: func(ctx context.Context) { <-ctx.Done() },
		OnStoppedLeading: func() {},
		OnNewLeader:      func(string) {},
	}
	elector := must[*pgfence.Elector](t)(pgfence.NewElector(client, cfg))
	runCtx, cancel := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- elector.Run(runCtx) }()
	eventually(t, 5*time.Second, "elected", elector.IsLeader)
	cancel()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	elector.Close()
	elector.Close()
	deadline := time.Now().Add(3 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<16)
		t.Fatalf("%d goroutines, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
}
