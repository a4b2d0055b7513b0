"""Leader election with a session-bound lease: candidates wait for "leader"; the one granted leads
until its session ends (a crash, a lost connection, pg_terminate_backend), which hands the lease
to the next candidate at once instead of after the TTL. The leader's writes carry its fence, so a
deposed leader that has not noticed yet cannot write."""

from __future__ import annotations

import threading

import psycopg
from _report import arguments, event, stop_after, summary

from pg_fence import Client, LeaseLost, StaleFence, WaitTimedOut

KEY = "leader"


def candidate(args, number: int, done: threading.Event) -> None:
    name = f"{args.name}-{number}"
    client = Client(args.conninfo, application_name=f"candidate-{name}")
    with psycopg.connect(args.conninfo, autocommit=True) as conn:
        while not done.is_set():
            try:
                lease = client.lease(KEY, args.ttl, wait=1, owner=name, session_bound=True)
            except WaitTimedOut:
                continue
            event("elected", candidate=name, fence=lease.fence)
            with lease:
                while not done.is_set() and not lease.lost.wait(0.05):
                    try:
                        with conn.transaction():
                            lease.guard(conn)
                            conn.execute("INSERT INTO leader_log (fence, leader) VALUES (%s, %s)", (lease.fence, name))
                    except StaleFence:
                        event("stale_write_refused_by_server", candidate=name, fence=lease.fence)
                        break
                    except LeaseLost:
                        event("write_stopped_locally", candidate=name, fence=lease.fence)
                        break
                if lease.state in ("lost", "unknown"):
                    event("lease_declared_lost", candidate=name, state=lease.state, lost_at=lease.lost_at)
    client.close()


def main() -> None:
    args = arguments(__doc__)
    with psycopg.connect(args.conninfo, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS leader_log"
            " (id bigserial PRIMARY KEY, fence bigint NOT NULL, leader text NOT NULL)"
        )
    done = stop_after(args.seconds)
    threads = [threading.Thread(target=candidate, args=(args, n, done)) for n in range(args.workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    summary(name=args.name)


if __name__ == "__main__":
    main()
