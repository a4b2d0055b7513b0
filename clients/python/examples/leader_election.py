"""Leader election with the elector: candidates campaign for "leader" with their name as the value;
the one elected leads until its leadership ends, and an observer prints every change of leader. The
leases are session-bound, so the end of the leader's session (a crash, a lost connection,
pg_terminate_backend) hands the key to the next candidate at once instead of after the TTL. The
leader's writes carry its fence, so a deposed leader that has not noticed yet cannot write; each
candidate is told why its leadership ended (on_stopped_leading)."""

from __future__ import annotations

import threading

import psycopg
from _report import arguments, event, stop_after, summary

from pg_fence import Client, LeaseLost, StaleFence, WaitTimedOut

KEY = "leader"


def candidate(args, number: int, done: threading.Event) -> None:
    name = f"{args.name}-{number}"
    client = Client(args.conninfo, application_name=f"candidate-{name}")

    def stopped(reason: str) -> None:
        event("stopped_leading", candidate=name, reason=reason)

    elector = client.elector(KEY, args.ttl, session_bound=True, on_stopped_leading=stopped)
    with elector, psycopg.connect(args.conninfo, autocommit=True) as conn:
        while not done.is_set():
            try:
                leadership = elector.campaign(name, wait=1)
            except WaitTimedOut:
                continue
            event("elected", candidate=name, fence=leadership.fence)
            with leadership:  # resigns when the block ends
                while not done.is_set() and not leadership.lost.wait(0.05):
                    try:
                        with conn.transaction():
                            leadership.guard(conn)
                            conn.execute(
                                "INSERT INTO leader_log (fence, leader) VALUES (%s, %s)", (leadership.fence, name)
                            )
                    except StaleFence:
                        event("stale_write_refused_by_server", candidate=name, fence=leadership.fence)
                        break
                    except LeaseLost:
                        event("write_stopped_locally", candidate=name, fence=leadership.fence)
                        break
                if leadership.state in ("lost", "unknown"):
                    event(
                        "lease_declared_lost",
                        candidate=name,
                        state=leadership.state,
                        reason=leadership.reason,
                        lost_at=leadership.lost_at,
                    )
    client.close()


def observer(elector) -> None:
    """Every change of leader, as observers see it: a new leader (a higher fence), or None."""
    for leader in elector.observe():
        if leader is None:
            event("no_leader")
        else:
            event("leader_observed", owner=leader.owner, fence=leader.fence)


def main() -> None:
    args = arguments(__doc__)
    with psycopg.connect(args.conninfo, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS leader_log"
            " (id bigserial PRIMARY KEY, fence bigint NOT NULL, leader text NOT NULL)"
        )
    done = stop_after(args.seconds)
    client = Client(args.conninfo, application_name="observer")
    watching = client.elector(KEY, args.ttl)
    watcher = threading.Thread(target=observer, args=(watching,))
    watcher.start()
    threads = [threading.Thread(target=candidate, args=(args, n, done)) for n in range(args.workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    watching.close()  # ends observe()
    watcher.join()
    client.close()
    summary(name=args.name)


if __name__ == "__main__":
    main()
