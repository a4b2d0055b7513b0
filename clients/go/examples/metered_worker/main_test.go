package main

import (
	"io"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"pgfence.io/pgfence/internal/pgtest"
)

// scrape is the worker's metrics text.
func scrape(t *testing.T, w *worker) string {
	t.Helper()
	resp, err := http.Get(w.url())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %d %v", resp.StatusCode, err)
	}
	return string(body)
}

// value is the sample of series (name and labels as the text shows them); 0 when absent.
func value(text, series string) float64 {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(text)
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// awaitScrape scrapes until check holds (30 s at most: the machine may be loaded).
func awaitScrape(t *testing.T, w *worker, what string, check func(string) bool) string {
	t.Helper()
	end := time.Now().Add(30 * time.Second)
	for {
		text := scrape(t, w)
		if check(text) {
			return text
		}
		if time.Now().After(end) {
			t.Fatalf("not within 30 s: %s in\n%s", what, text)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestMeteredWorker(t *testing.T) {
	c := pgtest.New(t, "go_metered_worker", 27751)
	first, err := start(c.Pool(t, "metered_first"), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer first.close()
	text := awaitScrape(t, first, "a renewal of the kept lease", func(s string) bool {
		return value(s, `pgfence_renew_duration_seconds_count{outcome="ok"}`) >= 1
	})
	t.Log(text)
	if v := value(text, "pgfence_leases_kept"); v != 1 {
		t.Fatalf("kept %v, want 1", v)
	}
	if v := value(text, `pgfence_acquire_duration_seconds_count{outcome="granted"}`); v != 1 {
		t.Fatalf("granted %v, want 1", v)
	}
	if v := value(text, `pgfence_lease_losses_total{reason="revoked"}`); v != 0 || !regexp.MustCompile(`pgfence_lease_losses_total\{reason="revoked"\} 0`).MatchString(text) {
		t.Fatalf("revoked %v, want a series at 0", v)
	}

	second, err := start(c.Pool(t, "metered_second"), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer second.close()
	refused := awaitScrape(t, second, "the second worker refused the key", func(s string) bool {
		return value(s, `pgfence_acquire_duration_seconds_count{outcome="refused"}`) >= 1
	})
	if v := value(refused, "pgfence_leases_kept"); v != 0 {
		t.Fatalf("the second worker keeps %v, want 0", v)
	}

	c.Revoke(t, key)
	lost := awaitScrape(t, first, "the revoked lease counted as lost", func(s string) bool {
		return value(s, `pgfence_lease_losses_total{reason="revoked"}`) == 1
	})
	t.Log(lost)
	// One of the two holds the key again: kept leases add up to one.
	end := time.Now().Add(30 * time.Second)
	for value(scrape(t, first), "pgfence_leases_kept")+value(scrape(t, second), "pgfence_leases_kept") != 1 {
		if time.Now().After(end) {
			t.Fatal("no worker holds the key again")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
