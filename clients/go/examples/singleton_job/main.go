// Singleton job: three instances fire the nightly report at every tick; one runs it under a kept
// lease, the others skip. On one tick the runner stalls past its TTL (a GC pause, a stopped
// process: modelled by a lease nobody renews), another instance runs the job meanwhile, and the
// stalled run's late write is refused by its fence.
//
//	go run ./examples/singleton_job "host=127.0.0.1 user=postgres dbname=postgres"
package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"pgfence.io/pgfence"
	"pgfence.io/pgfence/examples/common"
)

const job = "singleton:nightly-report"

func main() { common.Main("singleton_job", run) }

func run(ctx context.Context, pool *pgxpool.Pool, p *common.Printer) error {
	if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS reports;
		CREATE TABLE reports (day int PRIMARY KEY, written_by text, fence bigint)`); err != nil {
		return err
	}
	client := pgfence.NewClient(pool)
	for day := 1; day <= 4; day++ {
		// The three instances fire at once; the job runs under a kept lease while it runs.
		var wg sync.WaitGroup
		var mu sync.Mutex
		var runs []string
		var failed error
		for _, name := range []string{"instance-1", "instance-2", "instance-3"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				line, err := fire(ctx, client, day, name)
				mu.Lock()
				defer mu.Unlock()
				p.Say("%s", line)
				if err != nil {
					failed = err
				} else if line != "" && !strings.Contains(line, "skips") {
					runs = append(runs, name)
				}
			}()
		}
		wg.Wait()
		if failed != nil || len(runs) != 1 {
			return fmt.Errorf("day %d: ran by %v (%v)", day, runs, failed)
		}
	}
	return stalled(ctx, pool, p)
}

// fire is one instance at one tick: it runs the job if it gets the lease, else skips.
func fire(ctx context.Context, client *pgfence.Client, day int, name string) (string, error) {
	kept, err := client.Hold(ctx, job, pgfence.HoldOptions{AcquireOptions: pgfence.AcquireOptions{TTL: 2 * time.Second, Owner: name}})
	if errors.Is(err, pgfence.ErrWaitTimedOut) {
		return fmt.Sprintf("day %d: %s skips, the job runs elsewhere", day, name), nil
	} else if err != nil {
		return "", err
	}
	defer kept.Close()
	err = pgx.BeginFunc(ctx, client.Pool, func(tx pgx.Tx) error {
		if err := kept.Guard(ctx, tx); err != nil {
			return err
		}
		return write(ctx, tx, day, name, kept.Fence())
	})
	// The job takes a while: the other instances fire meanwhile, and find it held.
	time.Sleep(200 * time.Millisecond)
	return fmt.Sprintf("day %d: %s ran the job with fence %d", day, name, kept.Fence()), err
}

// stalled: a run whose process stops past its TTL while another instance runs the job.
func stalled(ctx context.Context, pool *pgxpool.Pool, p *common.Printer) error {
	lease, err := pgfence.Acquire(ctx, pool, job, pgfence.AcquireOptions{TTL: time.Second, Owner: "instance-1"})
	if err != nil || lease == nil {
		return fmt.Errorf("not granted: %v", err)
	}
	p.Say("day 5: instance-1 runs the job with fence %d, and stalls past its ttl", lease.Fence)
	time.Sleep(1200 * time.Millisecond)
	other, err := pgfence.Acquire(ctx, pool, job, pgfence.AcquireOptions{TTL: 10 * time.Second, Owner: "instance-2"})
	if err != nil || other == nil {
		return fmt.Errorf("not taken over: %v", err)
	}
	if err := guardedWrite(ctx, pool, 5, "instance-2", other.Fence); err != nil {
		return err
	}
	p.Say("day 5: instance-2 ran the job with fence %d", other.Fence)
	err = guardedWrite(ctx, pool, 5, "instance-1", lease.Fence)
	if !errors.Is(err, pgfence.ErrStaleFence) {
		return fmt.Errorf("the late write was not refused: %v", err)
	}
	p.Say("day 5: instance-1 wakes up; its late write is refused: %v", err)
	var writer string
	if err := pool.QueryRow(ctx, "SELECT written_by FROM reports WHERE day = 5").Scan(&writer); err != nil {
		return err
	}
	p.Say("day 5's report was written by %s", writer)
	_, err = pgfence.Release(ctx, pool, other)
	return err
}

func guardedWrite(ctx context.Context, pool *pgxpool.Pool, day int, name string, fence int64) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := pgfence.FenceGuard(ctx, tx, job, fence); err != nil {
			return err
		}
		return write(ctx, tx, day, name, fence)
	})
}

func write(ctx context.Context, tx pgx.Tx, day int, name string, fence int64) error {
	_, err := tx.Exec(ctx, `INSERT INTO reports VALUES ($1, $2, $3)
		ON CONFLICT (day) DO UPDATE SET written_by = $2, fence = $3`, day, name, fence)
	return err
}
