package pgfence

import (
	"slices"
	"testing"
	"time"
)

func backoff() Backoff {
	return Backoff{Base: 10 * time.Millisecond, Cap: 300 * time.Millisecond, MaxAttempts: 5, MaxElapsed: -1}
}

func TestTheCeilingDoublesUpToTheCap(t *testing.T) {
	b := backoff()
	var ceilings []time.Duration
	for n := range 8 {
		ceilings = append(ceilings, b.Ceiling(n)/time.Millisecond)
	}
	if want := []time.Duration{10, 20, 40, 80, 160, 300, 300, 300}; !slices.Equal(ceilings, want) {
		t.Fatalf("%v", ceilings)
	}
	if b.Ceiling(10_000) != b.Cap {
		t.Fatal("no overflow for huge retry counts")
	}
}

func TestFullJitterStaysWithinZeroAndTheCeilingAndSpreadsOverIt(t *testing.T) {
	b := backoff()
	for retry := range 10 {
		ceiling := b.Ceiling(retry)
		low, high := false, false
		for range 2000 {
			d := b.Delay(retry)
			if d < 0 || d > ceiling {
				t.Fatalf("retry %d: %v outside [0, %v]", retry, d, ceiling)
			}
			// Full jitter, not "ceiling plus a little": both ends of the range are used.
			low, high = low || d < ceiling/4, high || d > ceiling*3/4
		}
		if !low || !high {
			t.Fatalf("retry %d: low %v, high %v", retry, low, high)
		}
	}
}

func TestRetriesEndAfterMaxAttemptsOrMaxElapsed(t *testing.T) {
	b := backoff()
	now := time.Now()
	for tries := 1; tries < 5; tries++ {
		if _, more := b.next(tries, now); !more {
			t.Fatalf("ended after %d tries", tries)
		}
	}
	if _, more := b.next(5, now); more {
		t.Fatal("a sixth try")
	}
	b.MaxElapsed, b.MaxAttempts = 50*time.Millisecond, 100
	if _, more := b.next(1, now.Add(-time.Second)); more {
		t.Fatal("past max elapsed")
	}
	// By default only the time ends retries: tries that fail at once use up none.
	var zero Backoff
	if _, more := zero.next(1000, now); !more {
		t.Fatal("gave up after a number of tries")
	}
	if _, more := zero.next(1, now.Add(-30*time.Second)); more {
		t.Fatal("tried past 30 s")
	}
}

func TestTheServersReasonsAndAFastLeaseTheServerForgot(t *testing.T) {
	one := func(state, reason string, durable bool) *ended { return endedOf([][2]string{{state, reason}}, durable) }
	if one("live", "", true) != nil {
		t.Fatal("a live lease ended")
	}
	for _, c := range []struct {
		state, reason string
		durable       bool
		want          LossReason
	}{
		{"ended", "revoked", true, ReasonRevoked},
		{"ended", "taken_over", false, ReasonTakenOver},
		{"ended", "session_ended", true, ReasonSessionEnded},
		{"ended", "unknown", true, ReasonUnknown},
		{"ended", "unknown", false, ReasonRestarted},
	} {
		if got := one(c.state, c.reason, c.durable); got == nil || got.released || got.reason != c.want {
			t.Fatalf("%+v: %+v", c, got)
		}
	}
	if got := one("ended", "released", true); got == nil || !got.released {
		t.Fatalf("released: %+v", got)
	}
	set := endedOf([][2]string{{"live", ""}, {"ended", "expired"}, {"ended", "revoked"}}, true)
	if set.reason != ReasonExpired {
		t.Fatalf("the first that ended: %+v", set)
	}
}

func TestTheDefaultMarginIs100msOrAThousandthOfLongTTLs(t *testing.T) {
	for _, c := range []struct{ ttl, span time.Duration }{
		{time.Second, 980 * time.Millisecond},
		{30 * time.Second, 29900 * time.Millisecond},
		{time.Hour, time.Hour - 3600*time.Millisecond},
	} {
		span, every, _, err := HoldOptions{AcquireOptions: AcquireOptions{TTL: c.ttl}}.timing()
		if err != nil || span != c.span || every != c.ttl/3 {
			t.Fatalf("%v: span %v, every %v, %v", c.ttl, span, every, err)
		}
	}
}
