package pgfence_test

import (
	"context"
	"errors"
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

	// An observer without a TTL: it follows the key (elector.json's rule: a vacancy before any
	// leader is no news, so it is told the first leader).
	observer := must[*pgfence.Elector](t)(pgfence.NewElector(client, pgfence.ElectorConfig{Key: k + "-observed", Identity: "o"}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	leaderCfg := electorConfig(k+"-observed", "leader", 3*time.Second)
	leader := must[*pgfence.Elector](t)(pgfence.NewElector(client, leaderCfg))
	if _, err := leader.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	for seen, err := range observer.Observe(ctx) {
		if err != nil || seen == nil || seen.Owner != "leader" {
			t.Fatalf("observed %+v, %v: not the leader", seen, err)
		}
		break
	}
}
