package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"pgfence.io/pgfence/internal/pgtest"
)

func TestLeaderElection(t *testing.T) {
	c := pgtest.New(t, "example_leader", 27742)
	var out bytes.Buffer
	if err := run(context.Background(), c.ConnString("leader_election"), &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log(out.String())
	if n := strings.Count(out.String(), "stopped leading: revoked"); n != 2 {
		t.Fatalf("%d leaders told revoked in\n%s", n, out.String())
	}
	if n := strings.Count(out.String(), ": leading with fence"); n != 3 {
		t.Fatalf("%d leaderships in\n%s", n, out.String())
	}
	for _, want := range []string{"observer: the leader is", "written by 3 leaders"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("no %q in\n%s", want, out.String())
		}
	}
}
