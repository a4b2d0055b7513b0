// Package pgtest drives the scratch clusters of the repository's pg_test/cluster for the Go
// suite, and the faults its tests make: a proxy that loses replies or hangs, a stopped or crashed
// server. The Go suite takes ports 27730-27779: clusters 27730-27759, proxies 27760-27779.
package pgtest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"pgfence.io/pgfence"
	"pgfence.io/pgfence/examples/common"
)

// Cluster is a scratch PostgreSQL cluster (of $PG_MAJOR, 15 by default) with pg_fence created.
type Cluster struct {
	Name string
	Port int

	adminMu sync.Mutex
	admin   *pgx.Conn
}

// Root is the repository's root: the first directory above this one with pg_test/cluster.
func Root() string {
	dir, err := os.Getwd()
	if err != nil {
		panic(err)
	}
	for ; dir != filepath.Dir(dir); dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "pg_test", "cluster")); err == nil {
			return dir
		}
	}
	panic("pg_test/cluster not found above the working directory")
}

// New destroys what a previous run left, creates and starts the cluster, creates pg_fence, and
// destroys it when the test ends.
func New(t testing.TB, name string, port int) *Cluster {
	t.Helper()
	c, err := create(name, port)
	if c != nil {
		t.Cleanup(c.Destroy)
	}
	if err != nil {
		t.Fatal(err)
	}
	return c
}

var (
	sharedMu sync.Mutex
	shared   []*Cluster
)

// Shared is New for a cluster that several tests share: DestroyShared destroys it, from TestMain
// once every test has run.
func Shared(name string, port int) (*Cluster, error) {
	c, err := create(name, port)
	if c != nil {
		sharedMu.Lock()
		shared = append(shared, c)
		sharedMu.Unlock()
	}
	return c, err
}

// DestroyShared destroys the clusters Shared made.
func DestroyShared() {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	for _, c := range shared {
		c.Destroy()
	}
	shared = nil
}

func create(name string, port int) (*Cluster, error) {
	c := &Cluster{Name: "go_" + name, Port: port}
	_ = c.run("destroy")
	if err := c.run("create", fmt.Sprint(port)); err != nil {
		return nil, err
	}
	if err := c.run("start"); err != nil {
		return c, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.ConnString("pg_fence_go_test"))
	if err != nil {
		return c, err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "CREATE EXTENSION pg_fence")
	return c, err
}

func (c *Cluster) run(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	args = append([]string{args[0], c.Name}, args[1:]...)
	out, err := exec.CommandContext(ctx, filepath.Join(Root(), "pg_test", "cluster"), args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_test/cluster %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

func (c *Cluster) must(t testing.TB, args ...string) {
	t.Helper()
	if err := c.run(args...); err != nil {
		t.Fatal(err)
	}
}

func (c *Cluster) Start(t testing.TB) { c.must(t, "start") }
func (c *Cluster) Stop(t testing.TB)  { c.must(t, "stop") }

// Crash is kill -9 of the postmaster and all its children.
func (c *Cluster) Crash(t testing.TB) { c.must(t, "crash") }

func (c *Cluster) Destroy() {
	c.adminMu.Lock()
	if c.admin != nil {
		_ = c.admin.Close(context.Background())
		c.admin = nil
	}
	c.adminMu.Unlock()
	_ = c.run("destroy")
}

// Signal sends sig (STOP: the server stops answering, while its kernel still accepts connections
// and acknowledges packets; CONT resumes it) to the postmaster and every process it started.
func (c *Cluster) Signal(t testing.TB, sig string) {
	t.Helper()
	dir := os.Getenv("PG_FENCE_TEST_DIR")
	if dir == "" {
		dir = "/tmp/pg_fence_test"
	}
	pidFile, err := os.ReadFile(filepath.Join(dir, c.Name, "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid := strings.SplitN(string(pidFile), "\n", 2)[0]
	kids, _ := exec.Command("pgrep", "-P", pid).Output()
	signal := map[string]syscall.Signal{"STOP": syscall.SIGSTOP, "CONT": syscall.SIGCONT}[sig]
	for _, each := range append([]string{pid}, strings.Fields(string(kids))...) {
		n, _ := strconv.Atoi(each)
		// A backend may have ended since it was listed.
		if err := syscall.Kill(n, signal); err != nil && err != syscall.ESRCH {
			t.Fatalf("kill -%s %d: %v", sig, n, err)
		}
	}
}

// ConnString is a connection string to the cluster, or to port (a proxy's), whose sessions carry
// application_name app.
func (c *Cluster) ConnString(app string, port ...int) string {
	p := c.Port
	if len(port) > 0 {
		p = port[0]
	}
	return fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres application_name=%s", p, app)
}

// Pool is a pool tuned by pgfence.ParsePoolConfig, closed when the test ends.
func (c *Cluster) Pool(t testing.TB, app string, port ...int) *pgxpool.Pool {
	t.Helper()
	config, err := pgfence.ParsePoolConfig(c.ConnString(app, port...))
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Client is a pgfence.Client over a pool of its own.
func (c *Cluster) Client(t testing.TB, app string, port ...int) *pgfence.Client {
	return pgfence.NewClient(c.Pool(t, app, port...))
}

// Conn is one connection, closed when the test ends.
func (c *Cluster) Conn(t testing.TB, app string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), c.ConnString(app))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// SQL is the first column of the first row of query, as text ("" for none or NULL).
func (c *Cluster) SQL(t testing.TB, query string, args ...any) string {
	t.Helper()
	var value *string
	c.with(t, func(ctx context.Context, conn *pgx.Conn) error {
		err := conn.QueryRow(ctx, "SELECT ("+query+")::text", args...).Scan(&value)
		if err == pgx.ErrNoRows {
			return nil
		}
		return err
	})
	if value == nil {
		return ""
	}
	return *value
}

// Exec runs statements (no result), as a superuser.
func (c *Cluster) Exec(t testing.TB, statements string) {
	t.Helper()
	c.with(t, func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, statements)
		return err
	})
}

// with runs do on the cluster's administrator connection, made again when it broke (a crash).
// One connection for all: a new one costs a fork of a backend, which under load would count in
// the time a step takes to be told.
func (c *Cluster) with(t testing.TB, do func(context.Context, *pgx.Conn) error) {
	t.Helper()
	c.adminMu.Lock()
	defer c.adminMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for try := 0; ; try++ {
		if c.admin == nil || c.admin.IsClosed() {
			conn, err := pgx.Connect(ctx, c.ConnString("pg_fence_go_test"))
			if err != nil {
				t.Fatal(err)
			}
			c.admin = conn
		}
		err := do(ctx, c.admin)
		if err == nil {
			return
		}
		if !c.admin.IsClosed() || try > 0 {
			t.Fatal(err)
		}
	}
}

// Revoke ends the key's live lease (fence.lease_revoke).
func (c *Cluster) Revoke(t testing.TB, key string) string {
	return c.SQL(t, "SELECT fence.lease_revoke($1)", key)
}

// Terminate ends every session of app (pg_terminate_backend): how many.
func (c *Cluster) Terminate(t testing.TB, app string) string {
	return c.SQL(t, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1", app)
}

// TerminateClient ends every session of a client named app (pg_terminate_backend), its keeper's
// (app_keeper) included: how many.
func (c *Cluster) TerminateClient(t testing.TB, app string) string {
	return c.SQL(t, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name IN ($1, $1 || '_keeper')", app)
}

// Example runs an example against a cluster of its own and returns what it printed.
func Example(t *testing.T, name string, port int, run common.Run) string {
	t.Helper()
	c := New(t, name, port)
	var out bytes.Buffer
	if err := common.Against(context.Background(), c.ConnString(name), &out, run); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log(out.String())
	return out.String()
}
