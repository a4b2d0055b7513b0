"""What every example prints: one JSON line per event (with pg_fence.holding.clock(), which the processes
of one machine share, so a test can line them up with the faults it inflicts) and a summary."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections import Counter

from pg_fence.holding import clock

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
    parser.add_argument("--workers", type=int, default=4, help="threads (resource_workers, leader_election)")
    return parser.parse_args()


def stop_after(seconds: float) -> threading.Event:
    done = threading.Event()
    threading.Timer(seconds, done.set).start()
    return done


def fail(message: str) -> None:
    print(message, file=sys.stderr)
    sys.exit(1)
