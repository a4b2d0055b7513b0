"""A worker that keeps a lease and serves its pg_fence metrics for Prometheus.

It holds `worker:metered` (waiting for it while another instance has it), works while it holds it,
and holds it again once it is lost; http://127.0.0.1:PORT/metrics is prometheus_client's text of
pg_fence.prometheus's metrics (pgfence_leases_kept, pgfence_lease_losses_total{reason},
pgfence_acquire_duration_seconds, pgfence_renew_duration_seconds, ...). Needs
`pip install 'pg-fence[prometheus]'`.

    python metered_worker.py --conninfo "host=127.0.0.1 user=postgres dbname=postgres" --port 9464
    curl http://127.0.0.1:9464/metrics

SIGTERM or Ctrl-C stops it, its lease released."""

from __future__ import annotations

import argparse
import signal
import threading

import prometheus_client

from pg_fence import Client, WaitTimedOut
from pg_fence.prometheus import PrometheusObserver

KEY = "worker:metered"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conninfo", default="host=127.0.0.1 user=postgres dbname=postgres")
    parser.add_argument("--port", type=int, default=9464, help="the metrics' HTTP port (default 9464)")
    parser.add_argument("--ttl", type=float, default=3.0, help="the lease's TTL in seconds (default 3)")
    args = parser.parse_args()

    registry = prometheus_client.CollectorRegistry()
    server, _ = prometheus_client.start_http_server(args.port, addr="127.0.0.1", registry=registry)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"metrics at http://127.0.0.1:{server.server_port}/metrics", flush=True)
    try:
        with Client(args.conninfo, observer=PrometheusObserver(registry)) as client:
            while not stop.is_set():
                try:
                    lease = client.lease(KEY, args.ttl, wait=1)
                except WaitTimedOut:
                    continue  # another instance works: wait again
                with lease:
                    # The work: each step fenced with lease.guard(conn) in a real job.
                    while not stop.is_set() and not lease.lost.wait(0.1):
                        pass
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()


if __name__ == "__main__":
    main()
