package pgfence_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"pgfence.io/pgfence"
	"pgfence.io/pgfence/internal/pgtest"
)

// The kept lease's behaviours, from the language-neutral clients/behaviours/keeper.json: every
// scenario, step by step, against a real server. Prints how long each loss took to be told.
func TestKeeperBehaviours(t *testing.T) {
	t.Parallel()
	pgtest.RunScenarios(t, "keeper.json", "behaviours", 27732, 27733, func(t *testing.T, c *pgtest.Cluster, scenario pgtest.Scenario) {
		run := &keeperRun{t: t, c: c, scenario: scenario, key: fmt.Sprintf("%s:%d", scenario.Name, time.Now().UnixNano()),
			holders: map[string]*holder{}}
		defer run.resumes.Wait()
		run.Run(t, scenario.Steps, run.step)
	})
}

// holder is a kept lease on a client of its own, and what it was told.
type holder struct {
	kept  *pgfence.KeptLease
	proxy *pgtest.Proxy

	mu     sync.Mutex
	told   []error
	toldAt time.Time
}

func (h *holder) heard() ([]error, time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]error(nil), h.told...), h.toldAt
}

type keeperRun struct {
	pgtest.Timeline
	t        *testing.T
	c        *pgtest.Cluster
	scenario pgtest.Scenario
	key      string
	holders  map[string]*holder
	resumes  sync.WaitGroup
}

func (r *keeperRun) holder(t *testing.T, step pgtest.Step) *holder {
	h := r.holders[step.Name()]
	if h == nil {
		t.Fatalf("no holder %q", step.Name())
	}
	return h
}

func (r *keeperRun) step(t *testing.T, step pgtest.Step) {
	ctx := context.Background()
	switch step.Verb {
	case "hold":
		r.hold(t, step)
	case "held":
		h, until := r.holder(t, step), time.Now().Add(step.Seconds("for", 0))
		for time.Now().Before(until) {
			if !h.kept.IsHeld() {
				t.Fatalf("not held: %s", h.kept.State())
			}
			time.Sleep(20 * time.Millisecond)
		}
		if told, _ := h.heard(); len(told) > 0 {
			t.Fatalf("told %v", told)
		}
	case "revoke":
		r.c.Revoke(t, r.key)
	case "terminate":
		if n := r.c.Terminate(t, "beh_"+step.Name()); n == "0" {
			t.Fatal("no session ended")
		}
	case "stop_server_for":
		r.c.Signal(t, "STOP")
		r.resumes.Add(1)
		go func() {
			defer r.resumes.Done()
			time.Sleep(step.Seconds("stop_server_for", 0))
			r.c.Signal(t, "CONT")
		}()
	case "hang_connections":
		r.holder(t, step).proxy.HangExisting()
	case "crash_server":
		r.c.Crash(t)
		r.c.Start(t)
	case "take_over":
		h := r.holder(t, step)
		conn := r.c.Conn(t, "beh_other")
		lease, err := pgfence.Acquire(ctx, conn, r.key, pgfence.AcquireOptions{TTL: 30 * time.Second, Wait: step.Seconds("wait", 0)})
		if err != nil || lease == nil || lease.Fence <= h.kept.Fence() {
			t.Fatalf("taken over: %+v, %v", lease, err)
		}
	case "told":
		r.told(t, step)
	case "not_told":
		h := r.holder(t, step)
		if told, _ := h.heard(); len(told) > 0 || !h.kept.IsHeld() {
			t.Fatalf("told %v, state %s", told, h.kept.State())
		}
	case "guard":
		if got := r.guard(t, r.holder(t, step)); got != step.String("result") {
			t.Fatalf("guard: %s, not %s", got, step.String("result"))
		}
	case "release":
		h := r.holder(t, step)
		released, err := h.kept.Release(ctx)
		if want, _ := step.Args["result"].(bool); released != want {
			t.Fatalf("release: %v (%v), not %v", released, err, want)
		}
		if state := h.kept.State(); string(state) != step.String("state") {
			t.Fatalf("state %s after the release", state)
		}
		if step.Has("reason") && string(h.kept.Reason()) != step.String("reason") {
			t.Fatalf("reason %q after the release", h.kept.Reason())
		}
	default:
		t.Fatalf("unknown step %s", step.Verb)
	}
}

func (r *keeperRun) hold(t *testing.T, step pgtest.Step) {
	name := step.Name()
	h := &holder{}
	opts := pgfence.HoldOptions{
		AcquireOptions: pgfence.AcquireOptions{
			TTL: step.Seconds("ttl", r.scenario.TTL), Owner: name,
			Fast: !step.Bool("durable", true), SessionBound: step.Bool("session_bound", false),
		},
		RenewEvery: step.Seconds("renew_every", 0),
		OnLost: func(cause error) {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.told = append(h.told, cause)
			h.toldAt = time.Now()
		},
	}
	var client *pgfence.Client
	if step.Bool("via_proxy", false) {
		h.proxy = pgtest.NewProxy(r.t, 27760, r.c.Port)
		client = r.c.Client(r.t, "beh_"+name, h.proxy.Port())
	} else {
		client = r.c.Client(r.t, "beh_"+name)
	}
	kept, err := client.Hold(context.Background(), r.key, opts)
	if err != nil {
		t.Fatal(err)
	}
	r.t.Cleanup(func() { _ = kept.Close() })
	h.kept = kept
	r.holders[name] = h
	if !kept.IsHeld() {
		t.Fatal("not held at once")
	}
}

func (r *keeperRun) told(t *testing.T, step pgtest.Step) {
	h, within := r.holder(t, step), step.Seconds("within", 0)
	limit := r.PreviousStart.Add(within + 5*time.Second)
	for told, _ := h.heard(); len(told) == 0 && time.Now().Before(limit); told, _ = h.heard() {
		time.Sleep(time.Millisecond)
	}
	told, at := h.heard()
	if len(told) != 1 {
		t.Fatalf("told %v", told)
	}
	var lost *pgfence.LeaseLostError
	if !errors.As(told[0], &lost) || string(lost.Reason) != step.String("reason") {
		t.Fatalf("told %v, not %s", told[0], step.String("reason"))
	}
	select {
	case <-h.kept.Done():
	default:
		t.Fatal("told, but its Context is not done")
	}
	if cause := context.Cause(h.kept.Context()); !errors.Is(cause, pgfence.ErrLeaseLost) || cause != told[0] {
		t.Fatalf("the Context's cause %v, told %v", cause, told[0])
	}
	if state := h.kept.State(); string(state) != step.String("state") {
		t.Fatalf("state %s", state)
	}
	took := at.Sub(r.PreviousStart)
	fmt.Printf("[behaviour] %s: told %s %.1f ms after the %s began (limit %.0f ms)\n",
		r.scenario.Name, lost.Reason, float64(took)/1e6, r.PreviousVerb, float64(within)/1e6)
	if took > within {
		t.Fatalf("told after %v, more than %v", took, within)
	}
	if h.kept.IsHeld() {
		t.Fatal("held after told")
	}
}

// guard writes under the holder's fence in a transaction of its own: ok, stale (the server
// refused the fence), or lost (refused by the holder before anything was sent).
func (r *keeperRun) guard(t *testing.T, h *holder) string {
	ctx := context.Background()
	conn := r.c.Conn(t, "beh_writer")
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	err = h.kept.Guard(ctx, tx)
	switch {
	case err == nil:
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return "ok"
	case errors.Is(err, pgfence.ErrStaleFence):
		return "stale"
	case errors.Is(err, pgfence.ErrLeaseLost) && pgCode(err) == "":
		return "lost"
	}
	t.Fatalf("guard: %v", err)
	return ""
}
