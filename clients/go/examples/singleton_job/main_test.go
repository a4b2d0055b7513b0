package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"pgfence.io/pgfence/internal/pgtest"
)

func TestSingletonJob(t *testing.T) {
	c := pgtest.New(t, "example_singleton", 27740)
	var out bytes.Buffer
	if err := run(context.Background(), c.ConnString("singleton_job"), &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log(out.String())
	for _, want := range []string{"day 4: ", "skips", "refused", "day 5's report was written by instance-2"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("no %q in\n%s", want, out.String())
		}
	}
	if runs := strings.Count(out.String(), "ran the job"); runs != 5 {
		t.Fatalf("%d runs", runs)
	}
}
