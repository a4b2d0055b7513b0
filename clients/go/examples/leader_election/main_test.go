package main

import (
	"strings"
	"testing"

	"pgfence.io/pgfence/internal/pgtest"
)

func TestLeaderElection(t *testing.T) {
	out := pgtest.Example(t, "example_leader", 27742, run)
	if n := strings.Count(out, "stopped leading: revoked"); n != 2 {
		t.Fatalf("%d leaders told revoked in\n%s", n, out)
	}
	if n := strings.Count(out, ": leading with fence"); n != 3 {
		t.Fatalf("%d leaderships in\n%s", n, out)
	}
	for _, want := range []string{"observer: the leader is", "written by 3 leaders"} {
		if !strings.Contains(out, want) {
			t.Fatalf("no %q in\n%s", want, out)
		}
	}
}
