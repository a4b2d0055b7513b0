package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"pgfence.io/pgfence/internal/pgtest"
)

func TestInvoiceWorkers(t *testing.T) {
	c := pgtest.New(t, "example_invoices", 27741)
	var out bytes.Buffer
	if err := run(context.Background(), c.ConnString("invoice_workers"), &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log(out.String())
	for _, want := range []string{"operator: revoked invoice 3's lease", "lost (pgfence: lease on \"invoice:3\" lost: revoked)",
		"refused", "5 of 5 invoices done"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("no %q in\n%s", want, out.String())
		}
	}
	if c.SQL(t, "SELECT count(DISTINCT fence) FROM invoices") != "5" {
		t.Fatal("an invoice finished under another's fence")
	}
}
