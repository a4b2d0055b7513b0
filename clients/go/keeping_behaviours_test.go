package pgfence_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"pgfence.io/pgfence"
	"pgfence.io/pgfence/internal/pgtest"
)

// Keeping at scale, from the language-neutral clients/behaviours/keeping.json: every scenario,
// step by step, against a real server. Prints the connections and renewal latency of 200 leases.
func TestKeepingBehaviours(t *testing.T) {
	t.Parallel()
	pgtest.RunScenarios(t, "keeping.json", "keeping", 27743, 27744, func(t *testing.T, c *pgtest.Cluster, scenario pgtest.Scenario) {
		run := &keepingRun{t: t, c: c, scenario: scenario, key: fmt.Sprintf("%s:%d", scenario.Name, time.Now().UnixNano()),
			clients: map[string]*keepingClient{}}
		defer run.close()
		run.Run(t, scenario.Steps, run.step)
	})
}

// keepingClient is a client of its own (application_name beh_<name>), and what it keeps.
type keepingClient struct {
	app    string
	client *pgfence.Client
	pool   *pgxpool.Pool
	proxy  *pgtest.Proxy
	kept   []*pgfence.KeptLease
	hogged []*pgxpool.Conn

	mu   sync.Mutex
	told []error

	waiting  context.CancelFunc
	acquired chan acquired

	events chan observed
}

// acquired is how the acquire started by acquire_waiting ended.
type acquired struct {
	kept *pgfence.KeptLease
	err  error
}

type observed struct {
	leader *pgfence.Leader
	err    error
}

func (k *keepingClient) onLost(cause error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.told = append(k.told, cause)
}

type keepingRun struct {
	pgtest.Timeline
	t        *testing.T
	c        *pgtest.Cluster
	scenario pgtest.Scenario
	key      string
	clients  map[string]*keepingClient
	cancels  []context.CancelFunc
}

func (r *keepingRun) close() {
	for _, cancel := range r.cancels {
		cancel()
	}
	for _, k := range r.clients {
		if k.acquired != nil {
			select {
			case ended := <-k.acquired:
				if ended.kept != nil {
					_ = ended.kept.Close()
				}
			default:
			}
		}
		for _, kept := range k.kept {
			_ = kept.Close()
		}
		k.client.Close()
	}
}

// client is the client name, made with a pool of size connections (0: pgx's default), through a
// proxy when asked, its retries taking retryFor at most (0: the default backoff's).
func (r *keepingRun) client(t *testing.T, name string, size int, proxied bool, retryFor time.Duration) *keepingClient {
	if k := r.clients[name]; k != nil {
		return k
	}
	k := &keepingClient{app: "beh_" + name}
	port := r.c.Port
	if proxied {
		k.proxy = pgtest.NewProxy(r.t, 0, r.c.Port)
		port = k.proxy.Port()
	}
	config, err := pgfence.ParsePoolConfig(r.c.ConnString(k.app, port))
	if err != nil {
		t.Fatal(err)
	}
	if size > 0 {
		config.MaxConns = int32(size)
	}
	if k.pool, err = pgxpool.NewWithConfig(context.Background(), config); err != nil {
		t.Fatal(err)
	}
	r.t.Cleanup(k.pool.Close)
	k.client = pgfence.NewClient(k.pool)
	k.client.Backoff.MaxElapsed = retryFor
	r.clients[name] = k
	return k
}

func (r *keepingRun) known(t *testing.T, name string) *keepingClient {
	k := r.clients[name]
	if k == nil {
		t.Fatalf("no client %q", name)
	}
	return k
}

func (r *keepingRun) holdOptions(k *keepingClient, ttl time.Duration) pgfence.HoldOptions {
	opts := pgfence.HoldOptions{OnLost: k.onLost}
	opts.TTL = ttl
	return opts
}

func (r *keepingRun) step(t *testing.T, step pgtest.Step) {
	ctx := context.Background()
	switch step.Verb {
	case "hold_many":
		k := r.client(t, step.Name(), 0, false, 0)
		k.client.KeeperConnections = int(step.Args["keeper_connections"].(float64))
		count := int(step.Args["count"].(float64))
		for i := range count {
			kept, err := k.client.Hold(ctx, fmt.Sprintf("%s-%d", r.key, i), r.holdOptions(k, step.Seconds("ttl", 0)))
			if err != nil {
				t.Fatal(err)
			}
			k.kept = append(k.kept, kept)
		}
		r.allHeld(t, k)
	case "all_held":
		k := r.known(t, step.Name())
		until := time.Now().Add(step.Seconds("for", 0))
		for time.Now().Before(until) {
			r.allHeld(t, k)
			time.Sleep(20 * time.Millisecond)
		}
		stats := k.client.KeeperStats()
		fmt.Printf("[behaviour] %s: %d leases kept over %s connections, renewals p50 %.1f ms, p99 %.1f ms\n",
			r.scenario.Name, len(k.kept), r.keeperConnections(t, k),
			float64(stats.RenewalP50.Microseconds())/1000, float64(stats.RenewalP99.Microseconds())/1000)
	case "connections":
		k := r.known(t, step.Name())
		open, _ := strconv.Atoi(r.keeperConnections(t, k))
		made := k.client.KeeperStats().ConnectionsMade
		if atMost := int(step.Args["at_most"].(float64)); open > atMost || made > atMost {
			t.Fatalf("%d keeper connections open, %d made: more than %d", open, made, atMost)
		}
	case "hold":
		pool, _ := step.Args["pool"].(float64)
		k := r.client(t, step.Name(), int(pool), false, 0)
		kept, err := k.client.Hold(ctx, r.key, r.holdOptions(k, step.Seconds("ttl", 0)))
		if err != nil {
			t.Fatal(err)
		}
		k.kept = append(k.kept, kept)
	case "hog_pool":
		k := r.known(t, step.Name())
		for range k.pool.Config().MaxConns {
			conn, err := k.pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			k.hogged = append(k.hogged, conn)
		}
	case "release_pool":
		k := r.known(t, step.Name())
		for _, conn := range k.hogged {
			conn.Release()
		}
		k.hogged = nil
	case "held":
		k, until := r.known(t, step.Name()), time.Now().Add(step.Seconds("for", 0))
		for time.Now().Before(until) {
			r.allHeld(t, k)
			time.Sleep(20 * time.Millisecond)
		}
	case "release":
		k := r.known(t, step.Name())
		released, err := k.kept[0].Release(ctx)
		if err != nil || released != step.Bool("result", true) {
			t.Fatalf("released %v, %v", released, err)
		}
		k.kept = k.kept[1:]
	case "acquire_waiting":
		k := r.client(t, step.Name(), 0, true, step.Seconds("retry_for", 0))
		opts := r.holdOptions(k, step.Seconds("ttl", 0))
		opts.Wait = step.Seconds("wait", 0)
		waitCtx, cancel := context.WithCancel(ctx)
		k.waiting, k.acquired = cancel, make(chan acquired, 1)
		r.cancels = append(r.cancels, cancel)
		go func() {
			kept, err := k.client.Hold(waitCtx, r.key, opts)
			k.acquired <- acquired{kept, err}
		}()
	case "waiters":
		want := fmt.Sprint(step.Args["waiters"])
		eventually(t, 10*time.Second, "waiters "+want, func() bool {
			return r.c.SQL(t, "SELECT fence.waiters($1)", r.key) == want
		})
	case "hang_connections":
		r.known(t, step.Name()).proxy.HangExisting()
	case "release_other":
		by := r.known(t, step.String("by"))
		if released, err := by.kept[0].Release(ctx); !released || err != nil {
			t.Fatalf("released %v, %v", released, err)
		}
		by.kept = by.kept[1:]
	case "give_up":
		k := r.known(t, step.Name())
		k.waiting()
		select {
		case ended := <-k.acquired:
			k.acquired = nil
			if ended.kept != nil {
				_ = ended.kept.Close()
				t.Fatal("the given-up acquire was granted")
			}
			if !errors.Is(ended.err, context.Canceled) {
				t.Fatalf("the given-up acquire ended with %v, not its cancellation", ended.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the given-up acquire did not end")
		}
	case "key_free":
		within := step.Seconds("within", 0)
		for r.c.SQL(t, "SELECT count(*) FROM fence.leases WHERE key = $1 AND live", r.key) != "0" {
			if time.Since(r.PreviousStart) > within {
				t.Fatalf("the key still held %v after the give-up began: %s", time.Since(r.PreviousStart), r.c.SQL(t, "SELECT row_to_json(l)::text FROM fence.leases l WHERE key = $1 AND live", r.key))
			}
			time.Sleep(10 * time.Millisecond)
		}
		fmt.Printf("[behaviour] %s: the given-up grant released %.1f ms after the give-up began\n",
			r.scenario.Name, float64(time.Since(r.PreviousStart).Microseconds())/1000)
	case "pause":
		time.Sleep(step.Seconds("pause", 0))
	case "terminate":
		k := r.known(t, step.Name())
		if ended := r.c.TerminateClient(t, k.app); ended == "0" {
			t.Fatalf("no session of %s to end", k.app)
		}
	case "granted":
		k := r.known(t, step.Name())
		within := step.Seconds("within", 0)
		select {
		case ended := <-k.acquired:
			k.acquired = nil
			if ended.err != nil || ended.kept == nil {
				t.Fatalf("the acquire failed: %v (granted: %v)", ended.err, ended.kept != nil)
			}
			k.kept = append(k.kept, ended.kept)
			if !ended.kept.IsHeld() {
				t.Fatalf("not held: %s, %s", ended.kept.State(), ended.kept.Reason())
			}
		case <-time.After(within):
			t.Fatalf("no answer within %v", within)
		}
	case "hold_first_free":
		k := r.client(t, step.Name(), 0, false, 0)
		var keys []string
		for i := range int(step.Args["count"].(float64)) {
			keys = append(keys, fmt.Sprintf("%s-%d", r.key, i))
		}
		kept, err := k.client.HoldFirstFree(ctx, keys, r.holdOptions(k, step.Seconds("ttl", 0)))
		if err != nil {
			t.Fatal(err)
		}
		got, want := -1, -1
		if kept != nil {
			k.kept = append(k.kept, kept)
			got, _ = strconv.Atoi(kept.Key()[len(r.key)+1:])
		}
		if index, ok := step.Args["got"].(float64); ok {
			want = int(index)
		}
		if got != want {
			t.Fatalf("got key %d, not %d (-1: none)", got, want)
		}
	case "hold_other":
		other := r.client(t, "other_"+step.Name(), 0, false, 0)
		opts := pgfence.AcquireOptions{TTL: time.Hour}
		key := fmt.Sprintf("%s-%d", r.key, int(step.Args["index"].(float64)))
		if lease, err := other.client.Acquire(ctx, key, opts); lease == nil || err != nil {
			t.Fatalf("%s not held by the other: %v", key, err)
		}
	case "lead":
		k := r.client(t, step.Name(), 0, false, 0)
		cfg := electorConfig(r.key, step.Name(), step.Seconds("ttl", 0))
		elector, err := pgfence.NewElector(k.client, cfg)
		if err != nil {
			t.Fatal(err)
		}
		leadCtx, cancel := context.WithCancel(ctx)
		r.cancels = append(r.cancels, cancel)
		if _, err := elector.Campaign(leadCtx); err != nil {
			t.Fatal(err)
		}
	case "observe":
		k := r.client(t, step.Name(), 0, true, 0)
		cfg := electorConfig(r.key, step.Name(), step.Seconds("ttl", 3))
		elector, err := pgfence.NewElector(k.client, cfg)
		if err != nil {
			t.Fatal(err)
		}
		observeCtx, cancel := context.WithCancel(ctx)
		r.cancels = append(r.cancels, cancel)
		k.events = make(chan observed, 100)
		go func() {
			for leader, err := range elector.Observe(observeCtx) {
				select {
				case k.events <- observed{leader, err}:
				case <-observeCtx.Done():
					return
				}
			}
		}()
	case "observed":
		k := r.known(t, step.Name())
		event := r.next(t, k, 10*time.Second)
		want, _ := step.Args["leader"].(string)
		switch {
		case event.err != nil:
			t.Fatalf("observed %v", event.err)
		case want == "" && event.leader != nil, want != "" && (event.leader == nil || event.leader.Owner != want):
			t.Fatalf("observed %+v, not %q", event.leader, want)
		}
	case "blind":
		k := r.known(t, step.Name())
		within := step.Seconds("within", 0)
		event := r.next(t, k, within-time.Since(r.PreviousStart))
		if !errors.Is(event.err, pgfence.ErrObserverBlind) {
			t.Fatalf("observed %+v, %v: not blindness", event.leader, event.err)
		}
		fmt.Printf("[behaviour] %s: the observer said it cannot see %.1f ms after the hang began\n",
			r.scenario.Name, float64(time.Since(r.PreviousStart).Microseconds())/1000)
	default:
		t.Fatalf("unknown step %s", step.Verb)
	}
}

func (r *keepingRun) next(t *testing.T, k *keepingClient, limit time.Duration) observed {
	select {
	case event := <-k.events:
		return event
	case <-time.After(max(limit, 0)):
		t.Fatalf("nothing observed within %v", limit)
		return observed{}
	}
}

// allHeld fails unless every kept lease of k is held, and nothing was told.
func (r *keepingRun) allHeld(t *testing.T, k *keepingClient) {
	for _, kept := range k.kept {
		if !kept.IsHeld() {
			t.Fatalf("%s not held: %s, %s", kept.Key(), kept.State(), kept.Reason())
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.told) > 0 {
		t.Fatalf("told %v", k.told)
	}
}

// keeperConnections counts the connections of k's keeper open now.
func (r *keepingRun) keeperConnections(t *testing.T, k *keepingClient) string {
	return r.c.SQL(t, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", k.app+"_keeper")
}
