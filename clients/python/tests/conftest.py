"""Scratch clusters from pg_test/cluster (PostgreSQL of $PG_MAJOR, 15 by default), with pg_fence
created, for tests that need a real server. Ports 27500-27549 and 27620-27629 belong to this suite."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[3]
CLUSTER = ROOT / "pg_test" / "cluster"
TEST_DIR = Path(os.environ.get("PG_FENCE_TEST_DIR", "/tmp/pg_fence_test"))


class Cluster:
    def __init__(self, name: str, port: int):
        self.name, self.port = f"py_{name}", port
        self.conninfo = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"

    def run(self, *args: str) -> None:
        subprocess.run([str(CLUSTER), *args], check=True, stdout=subprocess.DEVNULL)

    def create(self) -> "Cluster":
        subprocess.run([str(CLUSTER), "destroy", self.name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.run("create", self.name, str(self.port))
        self.run("start", self.name)
        with self.connect() as conn:
            conn.execute("CREATE EXTENSION pg_fence")
        return self

    def connect(self, **kwargs) -> psycopg.Connection:
        return psycopg.connect(self.conninfo, autocommit=True, application_name="pg_fence_pytest", **kwargs)

    def sql(self, query: str, params: tuple = ()):
        with self.connect() as conn:
            return conn.execute(query, params).fetchone()

    def crash(self) -> None:
        self.run("crash", self.name)

    def start(self) -> None:
        self.run("start", self.name)

    def postmaster_pid(self) -> int:
        return int((TEST_DIR / self.name / "postmaster.pid").read_text().split()[0])

    def signal_server(self, signum: int) -> None:
        """`signum` to the postmaster and every process it started (SIGSTOP: the server stops
        answering, but its kernel still accepts connections and acknowledges packets)."""
        postmaster = self.postmaster_pid()
        children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True, text=True).stdout.split()
        for pid in [postmaster, *map(int, children)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def backend_pids(self, application_name: str) -> list:
        with self.connect() as conn:
            rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s", (application_name,))
            return [row[0] for row in rows]

    def destroy(self) -> None:
        subprocess.run([str(CLUSTER), "destroy", self.name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def eventually(check, limit: float = 20.0) -> bool:
    """Polls `check` until it is true or `limit` seconds have passed (a bound on a hang, not a speed test);
    at least once, as a limit may be spent before the caller asks."""
    end = time.monotonic() + limit
    while not check():
        if time.monotonic() >= end:
            return False
        time.sleep(0.005)
    return True


@pytest.fixture
def closed_mid_statement(monkeypatch) -> list:
    """The threads that closed a psycopg connection with a statement in flight: the call waiting
    for its answer would then read whatever comes next to the socket's number, another
    connection's replies."""
    closed: list = []
    close = psycopg.Connection.close

    def watched(conn: psycopg.Connection) -> None:
        if not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.ACTIVE:
            closed.append(threading.current_thread().name)
        close(conn)

    monkeypatch.setattr(psycopg.Connection, "close", watched)
    return closed


@contextlib.contextmanager
def interrupted_with_its_backend_stopped(cluster: Cluster, application_name: str, ready) -> Iterator[list]:
    """The block, run in the main thread, must wait on a statement of `application_name`'s. Once
    `ready()`, that backend is stopped (SIGSTOP: a cancel cannot end its statement yet) and the
    block gets a KeyboardInterrupt, which this expects. Yields the stopped pids, continued on exit."""
    stopped: list = []
    armed = True

    def interrupt(*_) -> None:
        if armed:
            raise KeyboardInterrupt

    def stop_then_interrupt() -> None:
        try:
            if eventually(ready, 10):
                pid = cluster.sql(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND state = 'active'",
                    (application_name,),
                )[0]
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
        finally:
            signal.pthread_kill(threading.main_thread().ident, signal.SIGALRM)

    previous = signal.signal(signal.SIGALRM, interrupt)
    stopper = threading.Thread(target=stop_then_interrupt)
    try:
        stopper.start()
        with pytest.raises(KeyboardInterrupt):
            yield stopped
    finally:
        armed = False
        stopper.join()
        signal.signal(signal.SIGALRM, previous)
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)


def waiters(cluster: Cluster, key: str) -> int:
    return cluster.sql("SELECT fence.waiters(%s)", (key,))[0]


def backend_gone(cluster: Cluster, pid: int):
    return lambda: cluster.sql("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,))[0] == 0


def behaviours(file: str) -> list:
    """The scenarios of the language-neutral clients/behaviours/`file`."""
    return json.loads((ROOT / "clients" / "behaviours" / file).read_text())["scenarios"]


@contextlib.contextmanager
def scenario_cluster(scenario: dict, shared: Cluster, name: str, port: int) -> Iterator[Cluster]:
    """`shared`, or a cluster of its own (`name`, `port`) for a scenario that crashes the server:
    after a crash the first grant waits for the clock to pass the fast reservation (up to 10 s),
    which would hold up the next scenario."""
    if not any("crash_server" in step for step in scenario["steps"]):
        yield shared
        return
    own = Cluster(name, port).create()
    try:
        yield own
    finally:
        own.destroy()


class Loop:
    """An event loop in a thread of its own, for a sync test to drive the asyncio API."""

    def __init__(self, limit: float = 30.0) -> None:
        self.limit = limit
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(self.limit)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """One cluster shared by the tests that inflict no faults on it."""
    cluster = Cluster("shared", 27500).create()
    yield cluster
    cluster.destroy()


@pytest.fixture
def own_cluster(request) -> Iterator[Cluster]:
    """A cluster of the test's own, for tests that crash or stop it; port from the test's marker."""
    marker = request.node.get_closest_marker("port")
    assert marker, "tests using own_cluster set @pytest.mark.port(N)"
    cluster = Cluster(request.node.name[:40], marker.args[0]).create()
    yield cluster
    cluster.destroy()


@pytest.fixture
def key(request) -> str:
    """A key no other test uses."""
    return f"{request.node.name}:{time.monotonic_ns()}"


def pytest_configure(config):
    config.addinivalue_line("markers", "port(n): the port of the test's own cluster")
