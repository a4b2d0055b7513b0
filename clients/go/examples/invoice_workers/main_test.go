package main

import (
	"strings"
	"testing"

	"pgfence.io/pgfence/internal/pgtest"
)

func TestInvoiceWorkers(t *testing.T) {
	out := pgtest.Example(t, "example_invoices", 27741, run)
	for _, want := range []string{"operator: revoked invoice 3's lease", "lost (pgfence: lease on \"invoice:3\" lost: revoked)",
		"refused", "5 of 5 invoices done, under 5 fences"} {
		if !strings.Contains(out, want) {
			t.Fatalf("no %q in\n%s", want, out)
		}
	}
}
