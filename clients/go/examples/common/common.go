// Package common is what the examples share: their command line, their pool, their printing.
package common

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"pgfence.io/pgfence"
)

// Run is an example's body: it creates its tables through pool and prints what happens to out.
type Run func(ctx context.Context, pool *pgxpool.Pool, out *Printer) error

// Main runs an example against the connection string of its one argument.
func Main(name string, run Run) {
	if len(os.Args) != 2 {
		fmt.Fprintf(os.Stderr, "usage: %s CONNSTRING\n", name)
		os.Exit(2)
	}
	if err := Against(context.Background(), os.Args[1], os.Stdout, run); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// Against runs an example on a pool of connString (tuned by pgfence.ParsePoolConfig).
func Against(ctx context.Context, connString string, out io.Writer, run Run) error {
	config, err := pgfence.ParsePoolConfig(connString)
	if err != nil {
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, config)
	if err != nil {
		return err
	}
	defer pool.Close()
	return run(ctx, pool, &Printer{out: out})
}

// Printer writes whole lines from several goroutines.
type Printer struct {
	mu  sync.Mutex
	out io.Writer
}

func (p *Printer) Say(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.out, format+"\n", args...)
}
