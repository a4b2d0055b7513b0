package main

import (
	"strings"
	"testing"

	"pgfence.io/pgfence/internal/pgtest"
)

func TestSingletonJob(t *testing.T) {
	out := pgtest.Example(t, "example_singleton", 27740, run)
	for _, want := range []string{"day 4: ", "skips", "refused", "day 5's report was written by instance-2"} {
		if !strings.Contains(out, want) {
			t.Fatalf("no %q in\n%s", want, out)
		}
	}
	if runs := strings.Count(out, "ran the job"); runs != 5 {
		t.Fatalf("%d runs", runs)
	}
}
