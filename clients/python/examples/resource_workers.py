"""Workers share per-resource leases: each invoice is processed by one worker at a time, any
worker may take any invoice, and `wait` queues a worker for a busy one instead of spinning.

The writes use fenced_write, which refuses any write carrying a fence below the one the row holds,
so even a writer that lost its lease unnoticed cannot overwrite a newer holder's work. Survives a
restart of the server (kill -9): calls retry on new connections, and durable leases survive."""

from __future__ import annotations

import random
import threading
import time

import psycopg
from _report import Reconnecting, arguments, event, reported, stop_after, summary, told_if_lost

from pg_fence import Client, Retry, fenced_write

INVOICES = 8


def worker(args, client: Client, done: threading.Event) -> None:
    conn = Reconnecting(args.conninfo)
    while not done.is_set():
        invoice = random.randrange(INVOICES)
        with reported(conn, invoice=invoice):
            with client.lease(f"invoice:{invoice}", args.ttl, wait=0.5, owner=args.name) as lease:
                time.sleep(random.uniform(0.01, 0.05))  # the work
                lease.check()
                fenced_write(conn.get(), "invoices", "fence", lease.fence, {"processed_by": args.name}, {"id": invoice})
                conn.get().execute("UPDATE invoices SET times = times + 1 WHERE id = %s", (invoice,))
                event("processed", invoice=invoice, fence=lease.fence)
            told_if_lost(lease)
    conn.close()


def main() -> None:
    args = arguments(__doc__)
    with psycopg.connect(args.conninfo, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS invoices"
            " (id int PRIMARY KEY, fence bigint, processed_by text, times int NOT NULL DEFAULT 0)"
        )
        conn.execute("INSERT INTO invoices (id) SELECT generate_series(0, %s - 1) ON CONFLICT DO NOTHING", (INVOICES,))
    done = stop_after(args.seconds)
    client = Client(args.conninfo, retry=Retry(attempts=20, cap=1.0, total=30))
    threads = [threading.Thread(target=worker, args=(args, client, done)) for _ in range(args.workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    client.close()
    summary(name=args.name)


if __name__ == "__main__":
    main()
