// Metered worker: a worker that keeps a lease and serves its pg_fence metrics for Prometheus. It
// holds worker:metered (waiting for it while another instance has it), works while it holds it,
// and holds it again once it is lost; GET /metrics is the Prometheus text of fenceprom's metrics
// (pgfence_leases_kept, pgfence_lease_losses_total{reason}, pgfence_acquire_duration_seconds,
// pgfence_renew_duration_seconds, ...).
//
//	go run ./examples/metered_worker "host=127.0.0.1 user=postgres dbname=postgres" 127.0.0.1:9464
//	curl http://127.0.0.1:9464/metrics
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"pgfence.io/pgfence"
	"pgfence.io/pgfence/fenceprom"
)

// key is the lease the worker keeps.
const key = "worker:metered"

type worker struct {
	client   *pgfence.Client
	server   *http.Server
	listener net.Listener
	cancel   context.CancelFunc
	done     chan struct{}
}

// start starts the worker on pool and its metrics server on addr ("127.0.0.1:0": any free port).
func start(pool *pgxpool.Pool, addr string) (*worker, error) {
	metrics := fenceprom.New()
	registry := prometheus.NewRegistry()
	registry.MustRegister(metrics)
	client := pgfence.NewClient(pool)
	client.Observer = metrics // before the client's first call

	listener, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	w := &worker{client: client, server: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second},
		listener: listener, done: make(chan struct{})}
	go func() { _ = w.server.Serve(listener) }()
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	go w.work(ctx)
	return w, nil
}

// work holds the key, works while it is held, and holds it again once lost, until ctx ends.
func (w *worker) work(ctx context.Context) {
	defer close(w.done)
	opts := pgfence.HoldOptions{AcquireOptions: pgfence.AcquireOptions{TTL: 3 * time.Second, Wait: time.Second}}
	for ctx.Err() == nil {
		kept, err := w.client.Hold(ctx, key, opts)
		switch {
		case errors.Is(err, pgfence.ErrWaitTimedOut):
			continue // another instance works: wait again
		case err != nil:
			if ctx.Err() == nil {
				fmt.Fprintln(os.Stderr, "metered worker:", err, "; trying again")
				time.Sleep(time.Second)
			}
			continue
		}
		// The work: each step fenced with kept.Guard(ctx, tx) in a real job.
		select {
		case <-kept.Done():
		case <-ctx.Done():
		}
		_ = kept.Close()
	}
}

// url is where the metrics are served.
func (w *worker) url() string { return "http://" + w.listener.Addr().String() + "/metrics" }

// close stops the worker (its lease released) and its server.
func (w *worker) close() {
	w.cancel()
	<-w.done
	_ = w.server.Close()
	w.client.Close()
}

func main() {
	if len(os.Args) < 2 || len(os.Args) > 3 {
		fmt.Fprintln(os.Stderr, "usage: metered_worker CONNSTRING [ADDR]")
		os.Exit(2)
	}
	addr := "127.0.0.1:9464"
	if len(os.Args) == 3 {
		addr = os.Args[2]
	}
	config, err := pgfence.ParsePoolConfig(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), config)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer pool.Close()
	w, err := start(pool, addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("metrics at", w.url())
	interrupt := make(chan os.Signal, 1)
	signal.Notify(interrupt, os.Interrupt)
	<-interrupt
	w.close()
}
