package pgfence_test

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"pgfence.io/pgfence/internal/pgtest"
)

type pgxTx = pgx.Tx

var readOnly = pgx.TxOptions{AccessMode: pgx.ReadOnly}

// shared is a cluster made by the first test that asks for it, and destroyed after the last
// test of the package (TestMain).
func shared(name string, port int) func(t *testing.T) *pgtest.Cluster {
	var once sync.Once
	var cluster *pgtest.Cluster
	var failed bool
	return func(t *testing.T) *pgtest.Cluster {
		t.Helper()
		once.Do(func() {
			var err error
			if cluster, err = pgtest.Shared(name, port); err != nil {
				t.Log(err)
				failed = true
			}
		})
		if failed {
			t.Fatalf("cluster %s could not be made", name)
		}
		return cluster
	}
}

// eventually waits until check is true, failing after limit.
func eventually(t *testing.T, limit time.Duration, what string, check func() bool) {
	t.Helper()
	end := time.Now().Add(limit)
	for !check() {
		if time.Now().After(end) {
			t.Fatalf("not within %v: %s", limit, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestMain(m *testing.M) {
	if args := os.Getenv(stoppedHolderEnv); args != "" {
		if err := stoppedHolder(args); err != nil {
			fmt.Fprintln(os.Stderr, "stopped holder:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	code := m.Run()
	pgtest.DestroyShared()
	os.Exit(code)
}
