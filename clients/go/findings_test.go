package pgfence_test

import (
	"context"
	"errors"
	"iter"
	"strings"
	"testing"
	"time"

	"pgfence.io/pgfence"
)

// Issue 41's Go findings on the elector's options: a missing TTL is named, options the elector
// owns are refused rather than ignored, and an observer needs no TTL.
func TestElectorOptionsFindings(t *testing.T) {
	t.Parallel()
	c, k := keptCluster(t), key(t)
	client := c.Client(t, "findings")
	campaigner := must[*pgfence.Elector](t)(pgfence.NewElector(client, pgfence.ElectorConfig{Key: k, Identity: "a"}))
	if _, err := campaigner.Campaign(context.Background()); !errors.Is(err, pgfence.ErrInvalidOptions) || !strings.Contains(err.Error(), "TTL is required") {
		t.Fatalf("a campaign without a TTL: %v", err)
	}
	for name, set := range map[string]func(*pgfence.ElectorConfig){
		"Owner":  func(cfg *pgfence.ElectorConfig) { cfg.Owner = "x" },
		"Wait":   func(cfg *pgfence.ElectorConfig) { cfg.Wait = time.Second },
		"OnLost": func(cfg *pgfence.ElectorConfig) { cfg.OnLost = func(error) {} },
		"Token":  func(cfg *pgfence.ElectorConfig) { cfg.Token[0] = 1 },
	} {
		cfg := electorConfig(k, "a", 3*time.Second)
		set(&cfg)
		if _, err := pgfence.NewElector(client, cfg); !errors.Is(err, pgfence.ErrInvalidOptions) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s set: %v", name, err)
		}
	}

	// An observer without a TTL: it follows the key (elector.json's rule: the present at once,
	// the vacancy included, then every change).
	observer := must[*pgfence.Elector](t)(pgfence.NewElector(client, pgfence.ElectorConfig{Key: k + "-observed", Identity: "o"}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	next, stop := iter.Pull2(observer.Observe(ctx))
	defer stop()
	start := time.Now()
	if seen, err, _ := next(); err != nil || seen != nil || time.Since(start) > 2*time.Second {
		t.Fatalf("observed %+v, %v after %v: not the vacancy at once", seen, err, time.Since(start))
	}
	leaderCfg := electorConfig(k+"-observed", "leader", 3*time.Second)
	leader := must[*pgfence.Elector](t)(pgfence.NewElector(client, leaderCfg))
	if _, err := leader.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	if seen, err, _ := next(); err != nil || seen == nil || seen.Owner != "leader" {
		t.Fatalf("observed %+v, %v: not the leader", seen, err)
	}
}

// Observe ended by its own context ends with that context's error, not "outcome unknown": an
// await_change given up changes nothing.
func TestObserveEndedByItsContextIsNotOutcomeUnknown(t *testing.T) {
	t.Parallel()
	c, k := keptCluster(t), key(t)
	observer := must[*pgfence.Elector](t)(pgfence.NewElector(c.Client(t, "findings_observe"), pgfence.ElectorConfig{Key: k, Identity: "o"}))
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	for seen, err := range observer.Observe(ctx) {
		if seen == nil && err == nil {
			continue // the vacancy, told at once
		}
		if !errors.Is(err, context.Canceled) || errors.Is(err, pgfence.ErrOutcomeUnknown) {
			t.Fatalf("observe ended by its context: %+v, %v", seen, err)
		}
	}
}

// OnStartedLeading gets its leadership, and the fence to guard writes with, from its context.
func TestOnStartedLeadingHasItsLeadership(t *testing.T) {
	t.Parallel()
	c, k := keptCluster(t), key(t)
	got := make(chan *pgfence.Leadership, 1)
	cfg := electorConfig(k, "a", 3*time.Second)
	cfg.Callbacks.OnStartedLeading = func(ctx context.Context) { got <- pgfence.LeadershipOf(ctx) }
	elector := must[*pgfence.Elector](t)(pgfence.NewElector(c.Client(t, "findings_started"), cfg))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := must[*pgfence.Leadership](t)(elector.Campaign(ctx))
	select {
	case started := <-got:
		if started != l || started.Fence() != l.Lease().Fence || started.Fence() == 0 {
			t.Fatalf("OnStartedLeading had %v, not the leadership", started)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("OnStartedLeading not called")
	}
	if pgfence.LeadershipOf(context.Background()) != nil {
		t.Fatal("a leadership from another context")
	}
}

// Resign returns, as Run does, once OnStoppedLeading has returned.
func TestResignWaitsForOnStoppedLeadingAsRunDoes(t *testing.T) {
	t.Parallel()
	c, k := keptCluster(t), key(t)
	returned := make(chan struct{})
	cfg := electorConfig(k, "a", 3*time.Second)
	cfg.Callbacks.OnStoppedLeading = func() {
		time.Sleep(300 * time.Millisecond)
		close(returned)
	}
	elector := must[*pgfence.Elector](t)(pgfence.NewElector(c.Client(t, "findings_resign"), cfg))
	l := must[*pgfence.Leadership](t)(elector.Campaign(context.Background()))
	if released, err := l.Resign(context.Background()); !released || err != nil {
		t.Fatalf("resigned %v, %v", released, err)
	}
	select {
	case <-returned:
	default:
		t.Fatal("Resign returned before OnStoppedLeading did")
	}
}
