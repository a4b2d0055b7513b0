// Per-invoice workers: four workers race for five invoices, each kept as a lease while it is
// worked on in fenced steps. One lease is revoked mid-work: its worker is told (its Context ends,
// with the reason) and stops; another finishes the invoice under a higher fence, and the steps
// the first would still write are refused.
//
//	go run ./examples/invoice_workers "host=127.0.0.1 user=postgres dbname=postgres"
package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"pgfence.io/pgfence"
	"pgfence.io/pgfence/examples/common"
)

const invoices, steps = 5, 3

func main() { common.Main("invoice_workers", run) }

func run(ctx context.Context, pool *pgxpool.Pool, p *common.Printer) error {
	if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS invoices;
		CREATE TABLE invoices (id int PRIMARY KEY, step int NOT NULL DEFAULT 0, worker text, fence bigint);
		INSERT INTO invoices (id) SELECT generate_series(1, 5)`); err != nil {
		return err
	}
	client := pgfence.NewClient(pool)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := 1; w <= 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- work(ctx, client, p, fmt.Sprintf("worker-%d", w))
		}()
	}
	// An operator revokes invoice 3's lease while it is worked on.
	go func() {
		for {
			var step int
			if err := pool.QueryRow(ctx, "SELECT step FROM invoices WHERE id = 3").Scan(&step); err != nil || step >= 1 {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		if _, err := pgfence.Revoke(ctx, pool, "invoice:3"); err == nil {
			p.Say("operator: revoked invoice 3's lease")
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	var done, fences int
	err := pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE step = $1), count(DISTINCT fence) FROM invoices", steps).Scan(&done, &fences)
	if err != nil {
		return err
	}
	// Each invoice finished under the fence of the worker that finished it.
	p.Say("%d of %d invoices done, under %d fences", done, invoices, fences)
	return nil
}

// work takes any invoice not yet done and not held, until every one is done.
func work(ctx context.Context, client *pgfence.Client, p *common.Printer, name string) error {
	for {
		var left []int
		rows, err := client.Pool.Query(ctx, "SELECT id FROM invoices WHERE step < $1 ORDER BY id", steps)
		if err != nil {
			return err
		}
		for rows.Next() {
			var id int
			if err := rows.Scan(&id); err != nil {
				return err
			}
			left = append(left, id)
		}
		if rows.Err() != nil || len(left) == 0 {
			return rows.Err()
		}
		for _, id := range left {
			if err := workOn(ctx, client, p, name, id); err != nil {
				return err
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// workOn does the steps of invoice id left to do, each a fenced update, if it gets its lease.
func workOn(ctx context.Context, client *pgfence.Client, p *common.Printer, name string, id int) error {
	key := fmt.Sprintf("invoice:%d", id)
	kept, err := client.Hold(ctx, key, pgfence.HoldOptions{AcquireOptions: pgfence.AcquireOptions{TTL: 5 * time.Second, Owner: name}})
	if errors.Is(err, pgfence.ErrWaitTimedOut) {
		return nil // another worker has it
	} else if err != nil {
		return err
	}
	defer kept.Close()
	for {
		var step int
		if err := client.Pool.QueryRow(ctx, "SELECT step FROM invoices WHERE id = $1", id).Scan(&step); err != nil {
			return err
		}
		if step == steps {
			return nil
		}
		if step == 1 && id == 3 {
			// Slow on this step: the operator's revoke lands meanwhile, and the keeper tells it at
			// its next renewal (every ttl/3).
			select {
			case <-kept.Done():
			case <-time.After(5 * time.Second):
			}
		}
		select {
		case <-kept.Done():
			p.Say("%s: told its lease on invoice %d is lost (%v); stops", name, id, context.Cause(kept.Context()))
			_, err := kept.FencedUpdate(ctx, client.Pool, "invoices", map[string]any{"step": step + 1}, map[string]any{"id": id})
			p.Say("%s: its next step on invoice %d is refused: %v", name, id, err)
			return nil
		default:
		}
		changes := map[string]any{"step": step + 1, "worker": name, "fence": kept.Fence()}
		if _, err := kept.FencedUpdate(ctx, client.Pool, "invoices", changes, map[string]any{"id": id}); err != nil {
			p.Say("%s: step %d of invoice %d refused: %v", name, step+1, id, err)
			return nil
		}
		p.Say("%s: invoice %d step %d under fence %d", name, id, step+1, kept.Fence())
		time.Sleep(30 * time.Millisecond)
	}
}
