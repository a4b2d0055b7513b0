"""Readers share a document, a writer changes it alone. Readers hold shared leases of "document"
(`shared=True`: any number at once) and read its title and its body in two transactions, each
guarded with the reader's own fence, with work between; the writer holds an exclusive lease of the
same key, granted only once no reader holds one (readers who come while it waits queue behind it:
first come first served across modes, so readers never starve it), and writes a new version of both
in one guarded transaction. No reader ever reads a title and a body of two versions ("torn_read"):
no writer is granted while a reader holds its lease, and a reader whose lease is gone is refused."""

from __future__ import annotations

import threading
import time

import psycopg
from _report import InUse, arguments, event, granted, run_threads, stop_after, summary, told_if_lost

from pg_fence import Client, LeaseLost, StaleFence

KEY = "document"


def guarded_read(conn: psycopg.Connection, lease, column: str) -> str:
    with conn.transaction():
        lease.guard(conn)
        return conn.execute(f"SELECT {column} FROM document WHERE id = 1").fetchone()[0]


def reader(number: int, args, client: Client, done: threading.Event, readers: InUse) -> None:
    name = f"{args.name}-reader-{number}"
    with psycopg.connect(args.conninfo, autocommit=True) as conn:
        while not done.is_set():
            lease = granted(lambda: client.lease(KEY, args.ttl, shared=True, wait=args.ttl, owner=name), worker=name)
            if lease is None:
                continue
            with lease:
                event("reading", worker=name, fence=lease.fence, readers=readers.enter())
                try:
                    for _ in range(3):
                        title = guarded_read(conn, lease, "title")
                        if done.is_set() or lease.lost.wait(0.02):  # the work between the two reads
                            break
                        body = guarded_read(conn, lease, "body")
                        event("read" if title == body else "torn_read", worker=name, title=title, body=body)
                except StaleFence:
                    event("stale_read_refused_by_server", worker=name, fence=lease.fence)
                except LeaseLost:
                    event("read_stopped_locally", worker=name, fence=lease.fence)
                finally:
                    readers.leave()
            told_if_lost(lease, worker=name)


def writer(number: int, args, client: Client, done: threading.Event) -> None:
    name = f"{args.name}-writer-{number}"
    with psycopg.connect(args.conninfo, autocommit=True) as conn:
        version = 0
        while not done.is_set():
            lease = granted(lambda: client.lease(KEY, args.ttl, wait=args.ttl, owner=name), worker=name)
            if lease is None:
                continue
            with lease:
                version += 1
                try:
                    with conn.transaction():
                        lease.guard(conn)
                        text = f"{name} v{version}"
                        conn.execute("UPDATE document SET title = %s, body = %s WHERE id = 1", (text, text))
                    event("wrote", worker=name, fence=lease.fence, version=version)
                except StaleFence:
                    event("stale_write_refused_by_server", worker=name, fence=lease.fence)
                except LeaseLost:
                    event("write_stopped_locally", worker=name, fence=lease.fence)
            told_if_lost(lease, worker=name)
            time.sleep(0.1)  # the readers' turn


def main() -> None:
    args = arguments(__doc__)
    with psycopg.connect(args.conninfo, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS document (id int PRIMARY KEY, title text, body text)")
        conn.execute("INSERT INTO document VALUES (1, 'v0', 'v0') ON CONFLICT DO NOTHING")
    done, readers = stop_after(args.seconds), InUse()
    with Client(args.conninfo) as client:
        writing = threading.Thread(target=writer, args=(0, args, client, done))
        writing.start()
        run_threads(reader, args.workers, args, client, done, readers)
        writing.join()
    summary(name=args.name, most_readers_at_once=readers.most)


if __name__ == "__main__":
    main()
