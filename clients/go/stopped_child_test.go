package pgfence_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"pgfence.io/pgfence"
	"pgfence.io/pgfence/internal/pgtest"
)

// stoppedHolderEnv makes this test binary, run again, the holder of TestAStoppedChild: "port key
// ttl_ms".
const stoppedHolderEnv = "PGFENCE_STOPPED_HOLDER"

// A child process holding a lease is stopped (SIGSTOP) past its TTL; another holder takes over
// and writes; on SIGCONT the child is told (unreachable: its deadline passed) before or at its
// next write, which never reaches the data, and a write it sends anyway with the old fence is
// refused (PF002).
func TestAStoppedChildIsToldBeforeItsNextWriteWhichIsRefused(t *testing.T) {
	t.Parallel()
	c, ctx := pgtest.New(t, "stopped_child", 27736), context.Background()
	c.Exec(t, "CREATE TABLE child_writes (id int PRIMARY KEY, writer text, fence bigint); INSERT INTO child_writes VALUES (1, 'nobody', 0)")
	k := key(t)
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), fmt.Sprintf("%s=%d %s 2000", stoppedHolderEnv, c.Port, k))
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = child.Process.Signal(syscall.SIGCONT)
		_ = child.Process.Kill()
		_ = child.Wait()
	}()
	lines := make(chan string, 100)
	go func() {
		scanner := bufio.NewScanner(out)
		for scanner.Scan() {
			lines <- scanner.Text()
		}
		close(lines)
	}()
	next := func() string {
		select {
		case line := <-lines:
			return line
		case <-time.After(20 * time.Second):
			t.Fatal("the child said nothing")
			return ""
		}
	}
	held := next()
	childFence, err := strconv.ParseInt(strings.TrimPrefix(held, "HELD "), 10, 64)
	if err != nil {
		t.Fatalf("%q", held)
	}
	// Stopped between two writes (it sleeps 300 ms after each), not in the middle of one.
	for range 2 {
		if line := next(); !strings.HasPrefix(line, "WROTE") {
			t.Fatalf("%q", line)
		}
	}
	if err := child.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	conn := c.Conn(t, "taker")
	taker := must[*pgfence.Lease](t)(pgfence.Acquire(ctx, conn, k, pgfence.AcquireOptions{TTL: ttl, Wait: 10 * time.Second}))
	if taker == nil || taker.Fence <= childFence {
		t.Fatalf("taker %+v", taker)
	}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if err := pgfence.FenceGuard(ctx, tx, k, taker.Fence); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "UPDATE child_writes SET writer = 'taker', fence = $1 WHERE id = 1", taker.Fence)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("[stopped child] taken over %.0f ms after the SIGSTOP (ttl 2000 ms)\n", float64(time.Since(stopped))/1e6)
	time.Sleep(500 * time.Millisecond)
	if err := child.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// The child exits once it has been told and has seen the server refuse its old fence.
	var after []string
	for line := range lines {
		after = append(after, line)
	}
	fmt.Printf("[stopped child] after SIGCONT: %v\n", after)
	// A busy machine may stop the child after its kept lease passed a write, not in its sleep: that
	// write then reaches the server, which refuses the old fence (MID_WRITE). Either way: told
	// (OnLost) and refused locally, in either order, the keeper and the writer both waking on
	// SIGCONT; then the server refuses the old fence again. Nothing written.
	if len(after) > 0 && after[0] == "MID_WRITE REFUSED_BY_SERVER PF002" {
		after = after[1:]
	}
	if len(after) != 3 {
		t.Fatalf("after SIGCONT: %v", after)
	}
	refusedLocally := slices.Index(after, "REFUSED_LOCALLY unreachable")
	refusedByServer := slices.Index(after, "REFUSED_BY_SERVER PF002")
	if !slices.Contains(after, "TOLD unreachable") || refusedLocally < 0 || refusedByServer < refusedLocally {
		t.Fatalf("after SIGCONT: %v", after)
	}
	if writer := c.SQL(t, "SELECT writer FROM child_writes WHERE id = 1"); writer != "taker" {
		t.Fatalf("written by %s", writer)
	}
}

// stoppedHolder is the child: it holds a lease and writes under it, each write guarded in its
// own transaction, printing what happens: HELD fence, WROTE n, TOLD reason (OnLost),
// REFUSED_LOCALLY reason (the kept lease refused the write), REFUSED_BY_SERVER sqlstate (a write
// with the old fence sent anyway).
func stoppedHolder(args string) error {
	var port, ttlMs int
	var key string
	if _, err := fmt.Sscan(args, &port, &key, &ttlMs); err != nil {
		return err
	}
	ctx := context.Background()
	connString := func(app string) string {
		return fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres application_name=%s", port, app)
	}
	config, err := pgfence.ParsePoolConfig(connString("stopped_child"))
	if err != nil {
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, config)
	if err != nil {
		return err
	}
	told := make(chan struct{})
	kept, err := pgfence.NewClient(pool).Hold(ctx, key, pgfence.HoldOptions{
		AcquireOptions: pgfence.AcquireOptions{TTL: time.Duration(ttlMs) * time.Millisecond},
		OnLost: func(cause error) {
			var lost *pgfence.LeaseLostError
			errors.As(cause, &lost)
			fmt.Println("TOLD", lost.Reason)
			close(told)
		},
	})
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, connString("stopped_child_writer"))
	if err != nil {
		return err
	}
	fmt.Println("HELD", kept.Fence())
	write := func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "UPDATE child_writes SET writer = 'child', fence = $1 WHERE id = 1", kept.Fence())
		return err
	}
	for n := 1; ; n++ {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if err := kept.Guard(ctx, tx); err != nil {
				return err
			}
			return write(tx)
		})
		var lost *pgfence.LeaseLostError
		if errors.As(err, &lost) {
			fmt.Println("REFUSED_LOCALLY", lost.Reason)
			err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				if err := pgfence.FenceGuard(ctx, tx, key, kept.Fence()); err != nil {
					return err
				}
				return write(tx)
			})
			if errors.Is(err, pgfence.ErrStaleFence) {
				fmt.Println("REFUSED_BY_SERVER", pgCode(err))
			} else {
				fmt.Println("WROTE_STALE", err)
			}
			select {
			case <-told:
			case <-time.After(20 * time.Second):
			}
			return nil
		}
		if errors.Is(err, pgfence.ErrStaleFence) {
			// Stopped after the kept lease passed this write: the server refused it.
			fmt.Println("MID_WRITE REFUSED_BY_SERVER", pgCode(err))
			continue
		}
		if err != nil {
			return err
		}
		fmt.Println("WROTE", n)
		time.Sleep(300 * time.Millisecond)
	}
}
