"""At most N workers at once on one resource (a licence-limited API, a pool of N GPUs): each worker
holds one of the N permits of "gpu-pool" (`permits=N`) while it works, and the others wait in line
for one (`wait`, first come first served). Each permit has a fence of its own, and each step's write
is guarded with it, so a worker that paused past its TTL, whose permit went to another worker, cannot
write. Run two of these side by side and pause one (kill -STOP) to see the other take its permits."""

from __future__ import annotations

import threading

import psycopg
from _report import InUse, arguments, event, granted, run_threads, stop_after, summary, told_if_lost

from pg_fence import Client, LeaseLost, StaleFence

KEY = "gpu-pool"
STEPS = 5


def worker(number: int, args, client: Client, done: threading.Event, in_use: InUse) -> None:
    name = f"{args.name}-{number}"
    with psycopg.connect(args.conninfo, autocommit=True) as conn:
        while not done.is_set():
            lease = granted(
                lambda: client.lease(KEY, args.ttl, permits=args.permits, wait=args.ttl, owner=name), worker=name
            )
            if lease is None:
                continue
            with lease:
                event("acquired", worker=name, fence=lease.fence, in_use=in_use.enter())
                try:
                    for step in range(STEPS):
                        if done.is_set() or lease.lost.wait(0.05):  # the work of one step
                            break
                        with conn.transaction():
                            lease.guard(conn)
                            conn.execute(
                                "INSERT INTO gpu_jobs (fence, worker, step) VALUES (%s, %s, %s)",
                                (lease.fence, name, step),
                            )
                        event("step", worker=name, fence=lease.fence)
                except StaleFence:
                    event("stale_write_refused_by_server", worker=name, fence=lease.fence)
                except LeaseLost:
                    event("write_stopped_locally", worker=name, fence=lease.fence)
                finally:
                    in_use.leave()  # before the release: the next holder may start at once
            told_if_lost(lease, worker=name)


def main() -> None:
    args = arguments(__doc__)
    with psycopg.connect(args.conninfo, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS gpu_jobs"
            " (id bigserial PRIMARY KEY, fence bigint NOT NULL, worker text NOT NULL, step int NOT NULL)"
        )
    done, in_use = stop_after(args.seconds), InUse()
    with Client(args.conninfo) as client:
        run_threads(worker, args.workers, args, client, done, in_use)
    summary(name=args.name, permits=args.permits, most_in_use=in_use.most)


if __name__ == "__main__":
    main()
