"""What every example prints: one JSON line per event (with pg_fence.holding.clock(), which the processes
of one machine share, so a test can line them up with the faults it inflicts) and a summary."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections import Counter
from contextlib import contextmanager
from typing import Callable, Iterator, Optional, TypeVar

import psycopg

from pg_fence import LeaseLost, OutcomeUnknown, StaleFence, WaitTimedOut
from pg_fence.holding import clock

T = TypeVar("T")

_lock = threading.Lock()
counts: Counter = Counter()


def event(name: str, **fields) -> None:
    counts[name] += 1
    with _lock:
        print(json.dumps({"event": name, "at": clock(), **fields}), flush=True)


def summary(**fields) -> None:
    print(json.dumps({"summary": dict(counts), **fields}), flush=True)


def arguments(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--conninfo", default="", help="libpq conninfo (default: the PG* variables)")
    parser.add_argument("--seconds", type=float, default=10, help="how long to run")
    parser.add_argument("--ttl", type=float, default=2.0, help="lease TTL in seconds")
    parser.add_argument("--name", default="example", help="this process's name in the tables")
    parser.add_argument("--workers", type=int, default=4, help="threads (all but singleton_job)")
    parser.add_argument("--permits", type=int, default=2, help="how many may hold the key at once (semaphore)")
    return parser.parse_args()


def stop_after(seconds: float) -> threading.Event:
    done = threading.Event()
    threading.Timer(seconds, done.set).start()
    return done


def fail(message: str) -> None:
    print(message, file=sys.stderr)
    sys.exit(1)


class InUse:
    """How many of this process's workers hold a lease of one key at a time, and the most at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = self.most = 0

    def enter(self) -> int:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
            return self.now

    def leave(self) -> None:
        with self._lock:
            self.now -= 1


def run_threads(target, count: int, *args) -> None:
    """`count` threads of `target(number, *args)`, joined."""
    threads = [threading.Thread(target=target, args=(number, *args)) for number in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def granted(take: Callable[[], T], **fields) -> Optional[T]:
    """`take()` (a kept lease), or None, reported as "waited", when it was not granted within its
    wait (or was gone by the time it was kept: LeaseLost)."""
    try:
        return take()
    except (WaitTimedOut, LeaseLost):
        event("waited", **fields)
        return None


def told_if_lost(kept, **fields) -> None:
    """Reports a kept lease (or set) that ended lost or unknown, with when it was declared."""
    if kept.state in ("lost", "unknown"):
        event("lease_declared_lost", state=kept.state, lost_at=kept.lost_at, **fields)


class Reconnecting:
    """A connection for the example's own writes, made again after the server went away."""

    def __init__(self, conninfo: str):
        self.conninfo = conninfo
        self._conn: Optional[psycopg.Connection] = None

    def get(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.conninfo, autocommit=True)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None


@contextmanager
def reported(conn: Reconnecting, **fields) -> Iterator[None]:
    """Around the taking of a lease and the work under it: reports how it ended, when not well (busy,
    a stale write refused, the work stopped locally, the server away: then `conn` is made again)."""
    try:
        yield
    except WaitTimedOut:
        event("busy", **fields)
    except StaleFence:
        event("stale_write_refused_by_server", **fields)
    except LeaseLost:
        event("write_stopped_locally", **fields)
    except (psycopg.OperationalError, OutcomeUnknown) as err:
        event("server_unavailable", error=type(err).__name__)
        conn.close()
        time.sleep(0.2)
