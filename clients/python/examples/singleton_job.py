"""One job instance at a time: run it on several machines, and only the lease's holder works.

Each step is written under the lease's fence: the guard and the INSERT commit together, so a holder
that paused past its TTL and woke up after another took over cannot write (StaleFence, or the
local check first). Run two of these side by side and pause one (kill -STOP) to see it."""

from __future__ import annotations

import time

import psycopg
from _report import arguments, event, stop_after, summary

from pg_fence import Client, LeaseLost, StaleFence, WaitTimedOut

KEY = "nightly-report"


def main() -> None:
    args = arguments(__doc__)
    done = stop_after(args.seconds)
    with psycopg.connect(args.conninfo, autocommit=True) as conn, Client(args.conninfo) as client:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS report_progress"
            " (id bigserial PRIMARY KEY, fence bigint NOT NULL, writer text NOT NULL, step int NOT NULL)"
        )
        while not done.is_set():
            try:
                lease = client.lease(KEY, args.ttl, wait=args.ttl, owner=args.name)
            except WaitTimedOut:
                continue
            event("acquired", fence=lease.fence)
            with lease:
                step = 0
                while not done.is_set() and not lease.lost.is_set():
                    time.sleep(0.05)  # the work of one step
                    try:
                        with conn.transaction():
                            lease.guard(conn)
                            conn.execute(
                                "INSERT INTO report_progress (fence, writer, step) VALUES (%s, %s, %s)",
                                (lease.fence, args.name, step),
                            )
                        step += 1
                        event("step", fence=lease.fence)
                    except StaleFence:
                        event("stale_write_refused_by_server", fence=lease.fence)
                        break
                    except LeaseLost:
                        event("write_stopped_locally", fence=lease.fence)
                        break
                if lease.lost.is_set():
                    event("lease_declared_lost", fence=lease.fence, state=lease.state, lost_at=lease.lost_at)
    summary(name=args.name)


if __name__ == "__main__":
    main()
