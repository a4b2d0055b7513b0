package fenceprom_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"pgfence.io/pgfence"
	"pgfence.io/pgfence/fenceprom"
	"pgfence.io/pgfence/internal/pgtest"
)

// eventually waits (generously: the machine may be loaded) until check is true.
func eventually(t *testing.T, what string, check func() bool) {
	t.Helper()
	end := time.Now().Add(30 * time.Second)
	for !check() {
		if time.Now().After(end) {
			t.Fatalf("not within 30 s: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// metric is the collected metric of that name whose label has that value (with label "", the
// first of that name), or nil.
func metric(t *testing.T, c prometheus.Collector, name, label, value string) *dto.Metric {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			match := label == ""
			for _, l := range m.GetLabel() {
				match = match || (l.GetName() == label && l.GetValue() == value)
			}
			if match {
				return m
			}
		}
	}
	return nil
}

// histogram is the histogram of that name under the label value, as collected.
func histogram(t *testing.T, c prometheus.Collector, name, label, value string) *dto.Histogram {
	t.Helper()
	m := metric(t, c, name, label, value)
	if m == nil {
		t.Fatalf("no %s{%s=%q}", name, label, value)
	}
	return m.GetHistogram()
}

// value is a gauge's or counter's value, found by name and one label; -1 when there is none.
func value(t *testing.T, c prometheus.Collector, name, label, labelValue string) float64 {
	t.Helper()
	m := metric(t, c, name, label, labelValue)
	switch {
	case m == nil:
		return -1
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	default:
		return m.GetCounter().GetValue()
	}
}

func TestMetrics(t *testing.T) {
	c := pgtest.New(t, "go_fenceprom", 27750)
	ctx := context.Background()
	newClient := func(t *testing.T, app string) (*pgfence.Client, *fenceprom.Metrics) {
		client := c.Client(t, app)
		m := fenceprom.New()
		client.Observer = m
		t.Cleanup(client.Close)
		return client, m
	}

	t.Run("acquires are timed by outcome", func(t *testing.T) {
		client, m := newClient(t, "fenceprom_acquire")
		key := fmt.Sprintf("metrics:acquire:%d", time.Now().UnixNano())
		if n := histogram(t, m, "pgfence_acquire_duration_seconds", "outcome", "granted").GetSampleCount(); n != 0 {
			t.Fatalf("granted %d before any acquire", n)
		}
		lease, err := client.Acquire(ctx, key, pgfence.AcquireOptions{TTL: 30 * time.Second})
		if err != nil || lease == nil {
			t.Fatalf("acquire: %v %v", lease, err)
		}
		refused, err := client.Acquire(ctx, key, pgfence.AcquireOptions{TTL: 30 * time.Second, Wait: 200 * time.Millisecond})
		if err != nil || refused != nil {
			t.Fatalf("second acquire: %v %v", refused, err)
		}
		granted := histogram(t, m, "pgfence_acquire_duration_seconds", "outcome", "granted")
		if granted.GetSampleCount() != 1 || granted.GetSampleSum() <= 0 {
			t.Fatalf("granted: %v", granted)
		}
		r := histogram(t, m, "pgfence_acquire_duration_seconds", "outcome", "refused")
		// The refused acquire waited 200 ms for the key: its time counts the wait.
		if r.GetSampleCount() != 1 || r.GetSampleSum() < 0.199 {
			t.Fatalf("refused: %v", r)
		}
		if n := histogram(t, m, "pgfence_acquire_duration_seconds", "outcome", "error").GetSampleCount(); n != 0 {
			t.Fatalf("%d errors", n)
		}
		_, _ = client.Release(ctx, lease)
	})

	t.Run("kept leases are counted up and down, renewals timed", func(t *testing.T) {
		client, m := newClient(t, "fenceprom_kept")
		opts := pgfence.HoldOptions{AcquireOptions: pgfence.AcquireOptions{TTL: 900 * time.Millisecond}}
		a, err := client.Hold(ctx, fmt.Sprintf("metrics:kept-a:%d", time.Now().UnixNano()), opts)
		if err != nil {
			t.Fatal(err)
		}
		b, err := client.Hold(ctx, fmt.Sprintf("metrics:kept-b:%d", time.Now().UnixNano()), opts)
		if err != nil {
			t.Fatal(err)
		}
		if v := value(t, m, "pgfence_leases_kept", "", ""); v != 2 {
			t.Fatalf("kept %v, want 2", v)
		}
		// Renewed every 300 ms: the keeper's calls are timed, with how many leases each renewed.
		eventually(t, "two renewals", func() bool {
			return histogram(t, m, "pgfence_renew_duration_seconds", "outcome", "ok").GetSampleCount() >= 2
		})
		if sum := histogram(t, m, "pgfence_renew_leases", "", "").GetSampleSum(); sum < 2 {
			t.Fatalf("renewed leases %v", sum)
		}
		_ = a.Close()
		if v := value(t, m, "pgfence_leases_kept", "", ""); v != 1 {
			t.Fatalf("kept %v after one release, want 1", v)
		}
		_ = b.Close()
		_ = b.Close()
		if v := value(t, m, "pgfence_leases_kept", "", ""); v != 0 {
			t.Fatalf("kept %v after both releases, want 0", v)
		}
		for _, reason := range []string{"expired", "revoked", "taken_over", "session_ended", "restarted", "unreachable", "unknown"} {
			if v := value(t, m, "pgfence_lease_losses_total", "reason", reason); v != 0 {
				t.Fatalf("%v losses %s: a release is no loss", v, reason)
			}
		}
	})

	t.Run("a session-bound lease's renewals are timed too", func(t *testing.T) {
		client, m := newClient(t, "fenceprom_bound")
		// Renewed on its own session, not by the keeper's batches.
		k, err := client.Hold(ctx, fmt.Sprintf("metrics:bound:%d", time.Now().UnixNano()),
			pgfence.HoldOptions{AcquireOptions: pgfence.AcquireOptions{TTL: 900 * time.Millisecond, SessionBound: true}})
		if err != nil {
			t.Fatal(err)
		}
		if v := value(t, m, "pgfence_leases_kept", "", ""); v != 1 {
			t.Fatalf("kept %v, want 1", v)
		}
		eventually(t, "two renewals", func() bool {
			return histogram(t, m, "pgfence_renew_duration_seconds", "outcome", "ok").GetSampleCount() >= 2
		})
		_ = k.Close()
		if v := value(t, m, "pgfence_leases_kept", "", ""); v != 0 {
			t.Fatalf("kept %v after the release, want 0", v)
		}
	})

	t.Run("a loss is counted with its reason", func(t *testing.T) {
		client, m := newClient(t, "fenceprom_loss")
		key := fmt.Sprintf("metrics:loss:%d", time.Now().UnixNano())
		k, err := client.Hold(ctx, key, pgfence.HoldOptions{AcquireOptions: pgfence.AcquireOptions{TTL: 900 * time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		defer k.Close()
		if v := value(t, m, "pgfence_lease_losses_total", "reason", "revoked"); v != 0 {
			t.Fatalf("revoked %v before the revoke", v)
		}
		c.Revoke(t, key)
		select {
		case <-k.Done():
		case <-time.After(30 * time.Second):
			t.Fatal("the revoked lease was not told lost")
		}
		var lost *pgfence.LeaseLostError
		if !errors.As(context.Cause(k.Context()), &lost) || lost.Reason != pgfence.ReasonRevoked {
			t.Fatalf("cause %v", context.Cause(k.Context()))
		}
		eventually(t, "the loss counted as revoked", func() bool {
			return value(t, m, "pgfence_lease_losses_total", "reason", "revoked") == 1
		})
		eventually(t, "the renewal that found it timed as lost", func() bool {
			return histogram(t, m, "pgfence_renew_duration_seconds", "outcome", "lost").GetSampleCount() == 1
		})
		if v := value(t, m, "pgfence_leases_kept", "", ""); v != 0 {
			t.Fatalf("kept %v after the loss, want 0", v)
		}
		if v := value(t, m, "pgfence_lease_losses_total", "reason", "expired"); v != 0 {
			t.Fatalf("expired %v", v)
		}
	})

	t.Run("leader is 1 while leading", func(t *testing.T) {
		client, m := newClient(t, "fenceprom_elector")
		election := fmt.Sprintf("metrics:election:%d", time.Now().UnixNano())
		e, err := pgfence.NewElector(client, pgfence.ElectorConfig{Key: election, Identity: "node-1",
			HoldOptions: pgfence.HoldOptions{AcquireOptions: pgfence.AcquireOptions{TTL: 5 * time.Second}}})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if n := testutil.CollectAndCount(m, "pgfence_leader"); n != 0 {
			t.Fatalf("%d leader series before any campaign", n)
		}
		l, err := e.Campaign(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if v := value(t, m, "pgfence_leader", "election", election); v != 1 {
			t.Fatalf("leader %v while leading, want 1", v)
		}
		if v := value(t, m, "pgfence_leases_kept", "", ""); v != 1 {
			t.Fatalf("kept %v: a leadership is a kept lease", v)
		}
		if ok, err := l.Resign(ctx); !ok || err != nil {
			t.Fatalf("resign: %v %v", ok, err)
		}
		eventually(t, "leader back to 0 after resigning", func() bool {
			return value(t, m, "pgfence_leader", "election", election) == 0
		})
		if v := value(t, m, "pgfence_leases_kept", "", ""); v != 0 {
			t.Fatalf("kept %v after resigning, want 0", v)
		}
	})
}
