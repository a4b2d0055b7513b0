"""Transfers between accounts under lease sets: a transfer holds the leases of both its accounts,
granted together or not at all (`client.lease_set`, lease_acquire_all), so two transfers over one
account never interleave and two in opposite directions never deadlock. It reads both balances, does
its work, then writes both in one transaction guarded with each account's own fence: a transfer that
lost its set (a restart of the server longer than its TTL) cannot write, so money is never made or
lost however the transfers and the faults interleave. Survives kill -9 of the server."""

from __future__ import annotations

import random
import threading
import time

import psycopg
from _report import Reconnecting, arguments, event, reported, run_threads, stop_after, summary, told_if_lost

from pg_fence import Client, Retry

ACCOUNTS = 5
OPENING_BALANCE = 100


def worker(number: int, args, client: Client, done: threading.Event) -> None:
    conn = Reconnecting(args.conninfo)
    while not done.is_set():
        source, target = random.sample(range(ACCOUNTS), 2)
        keys = [f"account:{source}", f"account:{target}"]
        with reported(conn, accounts=keys):
            with client.lease_set(keys, args.ttl, wait=0.5, owner=f"{args.name}-{number}") as leases:
                read = "SELECT id, balance FROM accounts WHERE id IN (%s, %s)"
                balances = dict(conn.get().execute(read, (source, target)).fetchall())
                amount = random.randint(0, balances[source])
                time.sleep(random.uniform(0.005, 0.02))  # the work between the read and the write
                with conn.get().transaction():
                    for key in keys:
                        leases.guard(conn.get(), key)
                    write = "UPDATE accounts SET balance = %s WHERE id = %s"
                    conn.get().execute(write, (balances[source] - amount, source))
                    conn.get().execute(write, (balances[target] + amount, target))
                event("transferred", source=source, target=target, amount=amount, fences=list(leases.fences.values()))
            told_if_lost(leases)
    conn.close()


def main() -> None:
    args = arguments(__doc__)
    with psycopg.connect(args.conninfo, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS accounts (id int PRIMARY KEY, balance bigint NOT NULL)")
        conn.execute(
            "INSERT INTO accounts SELECT g, %s FROM generate_series(0, %s - 1) g ON CONFLICT DO NOTHING",
            (OPENING_BALANCE, ACCOUNTS),
        )
    done = stop_after(args.seconds)
    with Client(args.conninfo, retry=Retry(attempts=20, cap=1.0, total=30)) as client:
        run_threads(worker, args.workers, args, client, done)
    with psycopg.connect(args.conninfo, autocommit=True) as conn:
        (total,) = conn.execute("SELECT sum(balance) FROM accounts").fetchone()
    summary(name=args.name, total=int(total), opening_total=ACCOUNTS * OPENING_BALANCE)


if __name__ == "__main__":
    main()
