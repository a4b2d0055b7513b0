// Leader election: three candidates campaign for a key with the Elector (client-go's callbacks),
// and an observer prints every change of leader. The leader writes runs guarded by its fence; its
// lease is revoked twice, and each time another is elected with a higher fence while the deposed
// one is told, by OnStoppedLeading, why.
//
//	go run ./examples/leader_election "host=127.0.0.1 user=postgres dbname=postgres"
package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"pgfence.io/pgfence"
	"pgfence.io/pgfence/examples/common"
)

const key = "leader:scheduler"

func main() { common.Main("leader_election", run) }

func run(ctx context.Context, pool *pgxpool.Pool, p *common.Printer) error {
	if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS runs;
		CREATE TABLE runs (n serial PRIMARY KEY, leader text, fence bigint)`); err != nil {
		return err
	}
	client := pgfence.NewClient(pool)
	ctx, stop := context.WithTimeout(ctx, 30*time.Second) // gives up without a new leader
	defer stop()

	observer, err := pgfence.NewElector(client, config3(""))
	if err != nil {
		return err
	}
	go func() {
		for leader, err := range observer.Observe(ctx) {
			switch {
			case err != nil:
				return
			case leader == nil:
				p.Say("observer: nobody leads")
			default:
				p.Say("observer: the leader is %s (fence %d)", leader.Owner, leader.Fence)
			}
		}
	}()

	elected := make(chan *pgfence.Leadership, 3)
	var wg sync.WaitGroup
	for _, name := range []string{"node-a", "node-b", "node-c"} {
		cfg := config3(name)
		var elector *pgfence.Elector
		cfg.Callbacks = pgfence.LeaderCallbacks{
			OnStartedLeading: func(leading context.Context) {
				l := elector.Leadership()
				p.Say("%s: leading with fence %d", name, l.Fence())
				elected <- l
				lead(leading, pool, p, name, l)
			},
			OnStoppedLeading: func() { p.Say("%s: stopped leading: %s", name, elector.Leadership().StopReason()) },
		}
		if elector, err = pgfence.NewElector(client, cfg); err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Campaign again after each leadership, until the example ends.
			for ctx.Err() == nil {
				if err := elector.Run(ctx); err != nil && ctx.Err() == nil {
					p.Say("%s: %v", name, err)
				}
			}
		}()
	}

	var fences []int64
	for revokes := 0; ; revokes++ {
		var l *pgfence.Leadership
		select {
		case l = <-elected:
		case <-ctx.Done():
			return errors.New("no new leader within 30 s")
		}
		fences = append(fences, l.Fence())
		if len(fences) > 1 && fences[len(fences)-1] <= fences[len(fences)-2] {
			return fmt.Errorf("fences did not increase: %v", fences)
		}
		time.Sleep(500 * time.Millisecond) // the leader does some work
		if revokes == 2 {
			break
		}
		if _, err := pgfence.Revoke(ctx, pool, key); err != nil {
			return err
		}
		p.Say("operator: revoked %s's lease", l.Value())
	}
	stop()
	wg.Wait()
	var runs, leaders int
	if err := pool.QueryRow(context.Background(), "SELECT count(*), count(DISTINCT fence) FROM runs").Scan(&runs, &leaders); err != nil {
		return err
	}
	p.Say("%d runs written by %d leaders, each under its own fence", runs, leaders)
	return nil
}

// config3 is a candidate's configuration: a 3 s lease, released when its context ends.
func config3(identity string) pgfence.ElectorConfig {
	cfg := pgfence.ElectorConfig{Key: key, Identity: identity, ReleaseOnCancel: true}
	cfg.TTL = 3 * time.Second
	return cfg
}

// lead writes a run every 100 ms, guarded by the leader's fence, until the leadership ends.
func lead(ctx context.Context, pool *pgxpool.Pool, p *common.Printer, name string, l *pgfence.Leadership) {
	for ctx.Err() == nil {
		err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
			if err := l.Guard(context.Background(), tx); err != nil {
				return err
			}
			_, err := tx.Exec(context.Background(), "INSERT INTO runs (leader, fence) VALUES ($1, $2)", name, l.Fence())
			return err
		})
		if errors.Is(err, pgfence.ErrStaleFence) {
			p.Say("%s: a run refused, deposed: %v", name, err)
			return
		} else if err != nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}
