package pgfence_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"pgfence.io/pgfence"
)

// The elector beyond the behaviours: client-go's Run, OnNewLeader, ReleaseOnCancel false.
func TestRunTellsTheCallbacksAndOnNewLeaderFollowsTheKey(t *testing.T) {
	t.Parallel()
	c, k := keptCluster(t), key(t)
	var mu sync.Mutex
	var events []string
	note := func(event string) { mu.Lock(); events = append(events, event); mu.Unlock() }
	seen := func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(events) }
	cfg := electorConfig(k, "node-a", 5*time.Second)
	cfg.Callbacks = pgfence.LeaderCallbacks{
		OnStartedLeading: func(ctx context.Context) {
			note("started")
			<-ctx.Done()
			note("ctx done: " + context.Cause(ctx).Error())
		},
		OnStoppedLeading: func() { note("stopped") },
		OnNewLeader:      func(identity string) { note("leader " + identity) },
	}
	elector := must[*pgfence.Elector](t)(pgfence.NewElector(c.Client(t, "run"), cfg))
	defer elector.Close()
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- elector.Run(ctx) }()
	eventually(t, 10*time.Second, "elected and observed", func() bool {
		return slices.Contains(seen(), "started") && slices.Contains(seen(), "leader node-a")
	})
	if !elector.IsLeader() {
		t.Fatal("not leader")
	}
	l := elector.Leadership()
	if err := l.Proclaim(context.Background(), "node-a at 10.0.0.1"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the proclaim observed", func() bool { return slices.Contains(seen(), "leader node-a at 10.0.0.1") })
	cancel()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	if l.StopReason() != pgfence.StopReleased || !slices.Contains(seen(), "stopped") {
		t.Fatalf("stop %s, events %v", l.StopReason(), seen())
	}
	eventually(t, 10*time.Second, "the vacancy observed", func() bool { return slices.Contains(seen(), "leader ") })
	if !slices.Contains(seen(), "ctx done: context canceled") {
		t.Fatalf("events %v", seen())
	}
}

func TestWithoutReleaseOnCancelACancelledLeaderLeavesItsLeaseToExpire(t *testing.T) {
	t.Parallel()
	c, k := keptCluster(t), key(t)
	cfg := electorConfig(k, "node-a", 2*time.Second)
	cfg.ReleaseOnCancel = false
	elector := must[*pgfence.Elector](t)(pgfence.NewElector(c.Client(t, "cancel"), cfg))
	ctx, cancel := context.WithCancel(context.Background())
	l := must[*pgfence.Leadership](t)(elector.Campaign(ctx))
	cancel()
	eventually(t, 5*time.Second, "stopped", func() bool { return l.StopReason() == pgfence.StopCancelled })
	if leader := must[*pgfence.Leader](t)(elector.Leader(context.Background())); leader == nil || leader.Fence != l.Fence() {
		t.Fatalf("the lease was released: %+v", leader)
	}
	if err := l.Guard(context.Background(), nil); !errors.Is(err, pgfence.ErrLeaseLost) && !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled leader still guards: %v", err)
	}
	eventually(t, 5*time.Second, "expired", func() bool { return must[*pgfence.Leader](t)(elector.Leader(context.Background())) == nil })
}

func TestAnElectorRefusesASharedLease(t *testing.T) {
	t.Parallel()
	cfg := electorConfig("k", "a", ttl)
	cfg.Shared = true
	if _, err := pgfence.NewElector(nil, cfg); !errors.Is(err, pgfence.ErrInvalidOptions) {
		t.Fatalf("%v", err)
	}
}
