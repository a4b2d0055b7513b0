package pgfence_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"pgfence.io/pgfence"
)

// A slow OnNewLeader (issue 41's Go finding): calls are not queued, the latest is kept. A callback
// that blocks while the leader changes several times is then called with the latest leader, and
// no change is silently lost at the end: its last call is the present leader, or the vacancy.
func TestASlowOnNewLeaderIsToldTheLatest(t *testing.T) {
	t.Parallel()
	c, k := keptCluster(t), key(t)
	var mu sync.Mutex
	var told []string
	unblock := make(chan struct{})
	calls := func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(told) }
	cfg := pgfence.ElectorConfig{Key: k, Identity: "watcher"}
	cfg.Callbacks.OnNewLeader = func(identity string) {
		mu.Lock()
		told = append(told, identity)
		first := len(told) == 1
		mu.Unlock()
		if first {
			<-unblock // slow: the leader changes meanwhile
		}
	}
	watcher := must[*pgfence.Elector](t)(pgfence.NewElector(c.Client(t, "slow_watcher"), cfg))
	defer watcher.Close()
	eventually(t, 5*time.Second, "the present (the vacancy) told", func() bool { return len(calls()) == 1 })
	if got := calls(); got[0] != "" {
		t.Fatalf("first told %q, not the vacancy", got[0])
	}
	ctx := context.Background()
	client := c.Client(t, "slow_candidates")
	a := must[*pgfence.Elector](t)(pgfence.NewElector(client, electorConfig(k, "a", 5*time.Second)))
	defer a.Close()
	la := must[*pgfence.Leadership](t)(a.Campaign(ctx))
	if _, err := la.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	b := must[*pgfence.Elector](t)(pgfence.NewElector(client, electorConfig(k, "b", 5*time.Second)))
	defer b.Close()
	lb := must[*pgfence.Leadership](t)(b.Campaign(ctx))
	if err := lb.Proclaim(ctx, "b2"); err != nil {
		t.Fatal(err)
	}
	close(unblock)
	// The next call is the latest leader, not the changes that came and went.
	eventually(t, 5*time.Second, "the latest leader told", func() bool { return len(calls()) >= 2 })
	time.Sleep(300 * time.Millisecond)
	if got := calls(); !slices.Equal(got, []string{"", "b2"}) {
		t.Fatalf("told %q, not the vacancy then the latest leader b2", got)
	}
	// A last change is not lost: the vacancy b leaves is the last call.
	if _, err := lb.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the vacancy told last", func() bool {
		got := calls()
		return len(got) == 3 && got[2] == ""
	})
}
