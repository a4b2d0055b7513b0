package pgfence_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"pgfence.io/pgfence"
	"pgfence.io/pgfence/internal/pgtest"
)

// The elector's behaviours, from clients/behaviours/elector.json, which the Python, Rust and Java
// suites run too: every scenario through the Go Elector, against a real server.
func TestElectorBehaviours(t *testing.T) {
	t.Parallel()
	pgtest.RunScenarios(t, "elector.json", "elector", 27734, 27735, func(t *testing.T, c *pgtest.Cluster, scenario pgtest.Scenario) {
		key := fmt.Sprintf("elector:%s:%d", scenario.Name, time.Now().UnixNano())
		watcher, err := pgfence.NewElector(c.Client(t, "beh_watcher"), electorConfig(key, "", 5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		run := &electorRun{t: t, c: c, scenario: scenario, key: key, watcher: watcher,
			candidates: map[string]*candidate{}, values: map[string]string{},
			observers: map[string]*observer{}, handed: map[string]*pgfence.Leader{}}
		run.Run(t, scenario.Steps, run.step)
	})
}

func electorConfig(key, identity string, ttl time.Duration) pgfence.ElectorConfig {
	cfg := pgfence.ElectorConfig{Key: key, Identity: identity, ReleaseOnCancel: true}
	cfg.TTL = ttl
	return cfg
}

// candidate is an elector on a client of its own, campaigning in the background.
type candidate struct {
	app     string
	elector *pgfence.Elector
	cancel  context.CancelFunc

	mu         sync.Mutex
	leadership *pgfence.Leadership
	err        error
	started    []context.Context
	stopped    []string
	stoppedAt  time.Time
}

func (c *candidate) state() (*pgfence.Leadership, error, []context.Context, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leadership, c.err, append([]context.Context(nil), c.started...), append([]string(nil), c.stopped...)
}

// observer records what an Observe yields.
type observer struct {
	mu   sync.Mutex
	seen []*pgfence.Leader
	read int
}

type electorRun struct {
	pgtest.Timeline
	t          *testing.T
	c          *pgtest.Cluster
	scenario   pgtest.Scenario
	key        string
	watcher    *pgfence.Elector
	candidates map[string]*candidate
	values     map[string]string
	observers  map[string]*observer
	handed     map[string]*pgfence.Leader
}

const electorLimit = 10 * time.Second

func (r *electorRun) candidate(t *testing.T, step pgtest.Step) *candidate {
	c := r.candidates[step.Name()]
	if c == nil {
		t.Fatalf("no candidate %q", step.Name())
	}
	return c
}

// leaderOf is the leader a candidate's leadership is to observers, with its current value; nil
// for no name.
func (r *electorRun) leaderOf(t *testing.T, name any) *pgfence.Leader {
	if name == nil {
		return nil
	}
	l, _, _, _ := r.candidates[name.(string)].state()
	if l == nil {
		t.Fatalf("%v does not lead", name)
	}
	return &pgfence.Leader{Fence: l.Fence(), Owner: r.values[name.(string)]}
}

func (r *electorRun) step(t *testing.T, step pgtest.Step) {
	ctx := context.Background()
	switch step.Verb {
	case "observe":
		r.observe(step.Name())
	case "campaign":
		r.campaign(t, step)
	case "leads":
		r.leads(t, step)
	case "waiters":
		want := strconv.Itoa(int(step.Args["waiters"].(float64)))
		eventually(t, electorLimit, "waiters "+want, func() bool { return r.c.SQL(t, "SELECT fence.waiters($1)", r.key) == want })
	case "waits":
		if l, err, _, _ := r.candidate(t, step).state(); l != nil || err != nil {
			t.Fatalf("not waiting: %v, %v", l, err)
		}
	case "observed":
		o := r.observers[step.Name()]
		var seen []*pgfence.Leader
		eventually(t, electorLimit, "something new observed", func() bool {
			o.mu.Lock()
			defer o.mu.Unlock()
			seen = append([]*pgfence.Leader(nil), o.seen...)
			return len(seen) > o.read
		})
		want := r.leaderOf(t, step.Args["leader"])
		if got := seen[o.read]; !want.Same(got) {
			t.Fatalf("observed %+v, not %+v (all: %v)", got, want, seen)
		}
		o.read++
	case "leader":
		got, err := r.watcher.Leader(ctx)
		if want := r.leaderOf(t, step.Args["leader"]); err != nil || !want.Same(got) {
			t.Fatalf("leader %+v (%v), not %+v", got, err, want)
		}
	case "proclaim":
		l, _, _, _ := r.candidate(t, step).state()
		if err := l.Proclaim(ctx, step.String("value")); err != nil {
			t.Fatal(err)
		}
		r.values[step.Name()] = step.String("value")
	case "resign":
		l, _, _, _ := r.candidate(t, step).state()
		found := step.String("found")
		if found == "" {
			found = "released"
		}
		resigned, err := l.Resign(ctx)
		if err != nil || resigned != (found == "released") {
			t.Fatalf("resign: %v, %v; the lease %s (%s)", resigned, err, l.Kept().State(), l.Kept().Reason())
		}
		if found != "released" && string(l.Kept().Reason()) != found {
			t.Fatalf("resign found %q, not %q", l.Kept().Reason(), found)
		}
	case "stopped":
		c := r.candidate(t, step)
		var stopped []string
		eventually(t, electorLimit, "on_stopped_leading told", func() bool {
			_, _, _, stopped = c.state()
			return len(stopped) > 0
		})
		if len(stopped) != 1 || stopped[0] != step.String("reason") {
			t.Fatalf("stopped %v, not %s", stopped, step.String("reason"))
		}
		c.mu.Lock()
		took := c.stoppedAt.Sub(r.PreviousStart)
		c.mu.Unlock()
		fmt.Printf("[behaviour] elector %s: on_stopped_leading told %s %.1f ms after the %s began\n",
			r.scenario.Name, stopped[0], float64(took)/1e6, r.PreviousVerb)
	case "handoff":
		l, _, _, _ := r.candidate(t, step).state()
		next, err := l.Handoff(ctx, step.String("to"))
		if err != nil {
			t.Fatal(err)
		}
		result, _ := step.Args["result"].(string)
		switch {
		case result == "" && next != nil:
			t.Fatalf("handed to %+v", next)
		case result != "" && (next == nil || next.Owner != r.values[result]):
			t.Fatalf("handed to %+v, not %s", next, result)
		case result != "":
			r.handed[result] = next
		}
	case "cancel":
		r.candidate(t, step).cancel()
	case "revoke":
		if r.c.Revoke(t, r.key) != "true" {
			t.Fatal("nothing revoked")
		}
	case "terminate":
		if r.c.Terminate(t, r.candidate(t, step).app) == "0" {
			t.Fatal("no session ended")
		}
	case "freeze_server":
		r.c.Signal(t, "STOP")
		time.Sleep(step.Seconds("freeze_server", 0))
		r.c.Signal(t, "CONT")
	case "crash_server":
		r.c.Crash(t)
		r.c.Start(t)
	default:
		t.Fatalf("unknown step %s", step.Verb)
	}
}

func (r *electorRun) observe(name string) {
	o := &observer{}
	r.observers[name] = o
	ctx, cancel := context.WithCancel(context.Background())
	r.t.Cleanup(cancel)
	go func() {
		for leader, err := range r.watcher.Observe(ctx) {
			if errors.Is(err, pgfence.ErrObserverBlind) {
				continue // keeping.json's blind step asks for these; here the changes are what count
			}
			if err != nil {
				return
			}
			o.mu.Lock()
			o.seen = append(o.seen, leader)
			o.mu.Unlock()
		}
	}()
}

func (r *electorRun) campaign(t *testing.T, step pgtest.Step) {
	name := step.Name()
	c := &candidate{app: "beh_" + name + "_" + uuid.NewString()[:8]}
	cfg := electorConfig(r.key, step.String("value"), step.Seconds("ttl", r.scenario.TTL))
	cfg.Fast = !step.Bool("durable", true)
	cfg.SessionBound = step.Bool("session_bound", false)
	cfg.LockDelay = step.Seconds("lock_delay", 0)
	cfg.Callbacks = pgfence.LeaderCallbacks{
		OnStartedLeading: func(ctx context.Context) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.started = append(c.started, ctx)
		},
		OnStoppedLeading: func() {
			reason := c.elector.Leadership().StopReason()
			c.mu.Lock()
			defer c.mu.Unlock()
			c.stopped = append(c.stopped, string(reason))
			c.stoppedAt = time.Now()
		},
	}
	elector, err := pgfence.NewElector(r.c.Client(r.t, c.app), cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.elector = elector
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	done := make(chan struct{})
	r.t.Cleanup(func() {
		cancel()
		<-done
		if l, _, _, _ := c.state(); l != nil {
			_, _ = l.Resign(context.Background())
		}
		elector.Close()
	})
	r.candidates[name] = c
	r.values[name] = step.String("value")
	go func() {
		defer close(done)
		l, err := elector.Campaign(ctx)
		c.mu.Lock()
		defer c.mu.Unlock()
		c.leadership, c.err = l, err
	}()
}

func (r *electorRun) leads(t *testing.T, step pgtest.Step) {
	c := r.candidate(t, step)
	limit := step.Seconds("within", electorLimit.Seconds())
	eventually(t, limit, "elected", func() bool { l, err, _, _ := c.state(); return l != nil || err != nil })
	l, err, _, _ := c.state()
	if err != nil {
		t.Fatalf("the campaign failed: %v", err)
	}
	if took := time.Since(r.Ended); step.Has("not_before") && took < step.Seconds("not_before", 0) {
		t.Fatalf("elected after %v", took)
	}
	eventually(t, 5*time.Second, "on_started_leading told", func() bool {
		_, _, started, _ := c.state()
		return len(started) == 1 && started[0] == l.Context()
	})
	if step.Has("fence_above") {
		other, _, _, _ := r.candidates[step.String("fence_above")].state()
		if l.Fence() <= other.Fence() {
			t.Fatalf("fence %d, not above %d", l.Fence(), other.Fence())
		}
	}
	if handed := r.handed[step.Name()]; handed != nil && !handed.Same(r.leaderOf(t, step.Name())) {
		t.Fatalf("leads with %+v, not the hand-off's %+v", r.leaderOf(t, step.Name()), handed)
	}
	if reason := l.StopReason(); reason != "" {
		t.Fatalf("stopped already: %s", reason)
	}
}
