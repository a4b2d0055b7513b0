"""The kept lease's behaviours (clients/behaviours/keeper.json, which the Java suite runs too), each
scenario run through the sync and the asyncio kept lease against a real server. Prints how long
each loss took to be told."""

from __future__ import annotations

import signal
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

import psycopg
import pytest
from conftest import Cluster, Loop, behaviours, eventually, scenario_cluster
from proxy import Proxy

import pg_fence
from pg_fence import Client, LeaseLost, StaleFence
from pg_fence.aio import AsyncClient
from pg_fence.holding import clock

SCENARIOS = behaviours("keeper.json")

#: What a holder was told by on_lost: the reason, and when (pg_fence.holding.clock()).
Told = List[Tuple[str, float]]


@pytest.fixture(scope="module")
def keeper_cluster():
    cluster = Cluster("keeper_behaviours", 27620).create()
    yield cluster
    cluster.destroy()


class SyncHolder:
    """A holder through the sync KeptLease (client.lease), on a client of its own."""

    def __init__(self, conninfo: str, app: str, key: str, options: dict, on_lost: Callable[[Any], None]):
        self.client = Client(conninfo, application_name=app)
        self.lease = self.client.lease(key, on_lost=on_lost, **options)

    def read(self, what: Callable[[Any], Any]) -> Any:
        return what(self.lease)

    def guard(self, conninfo: str) -> None:
        with psycopg.connect(conninfo, autocommit=True, application_name="beh_writer") as conn, conn.transaction():
            self.lease.guard(conn)

    def release(self) -> bool:
        return self.lease.release()

    def close(self) -> None:
        self.lease.release()
        self.client.close()


class AsyncHolder:
    """A holder through the asyncio AsyncKeptLease, driven from the runner's thread; the lease is
    read on its loop, since reading its state may declare it lost, which only the loop may do."""

    def __init__(self, loop: Loop, conninfo: str, app: str, key: str, options: dict, on_lost: Callable[[Any], None]):
        self.loop = loop

        async def make() -> None:
            self.client = AsyncClient(conninfo, application_name=app)
            self.lease = await self.client.lease(key, on_lost=on_lost, **options)

        loop.run(make())

    def read(self, what: Callable[[Any], Any]) -> Any:
        async def read() -> Any:
            return what(self.lease)

        return self.loop.run(read())

    def guard(self, conninfo: str) -> None:
        async def guard() -> None:
            async with await psycopg.AsyncConnection.connect(
                conninfo, autocommit=True, application_name="beh_writer"
            ) as conn:
                async with conn.transaction():
                    await self.lease.guard(conn)

        self.loop.run(guard())

    def release(self) -> bool:
        return self.loop.run(self.lease.release())

    def close(self) -> None:
        async def close() -> None:
            await self.lease.release()
            await self.client.close()

        self.loop.run(close())


class Holder:
    """A holder of the scenario: its kept lease (either flavour), what it was told, its proxy."""

    def __init__(self, kept: Any, told: Told, proxy: Optional[Proxy]):
        self.kept, self.told, self.proxy = kept, told, proxy

    def state(self) -> str:
        return self.kept.read(lambda lease: lease.state)

    def held(self) -> bool:
        return self.kept.read(lambda lease: lease.held())

    def told_reasons(self) -> List[str]:
        return [reason for reason, _ in self.told]


class Run:
    """One scenario: its steps in order, against `cluster`, through the `flavour` of kept lease."""

    def __init__(self, cluster: Cluster, scenario: dict, flavour: str):
        self.cluster, self.scenario, self.flavour = cluster, scenario, flavour
        self.key = f"keeper:{scenario['name']}:{flavour}:{time.monotonic_ns()}"
        self.loop = Loop() if flavour == "asyncio" else None
        self.holders: Dict[str, Holder] = {}
        self.apps: Dict[str, str] = {}
        self.resumes: List[threading.Timer] = []
        self.step_started, self.previous_started = clock(), clock()
        self.step_ended, self.previous_ended = clock(), clock()
        self.kind, self.previous_kind = "", ""
        # Made before the steps, so that a revoke or a terminate starts as its step does, not after
        # a connection's startup (tens of ms on a loaded machine).
        self.admin = cluster.connect()

    def run(self) -> None:
        try:
            for number, step in enumerate(self.scenario["steps"]):
                self.previous_started, self.previous_ended = self.step_started, self.step_ended
                self.previous_kind = self.kind
                self.step_started, self.kind = clock(), next(iter(step))
                try:
                    getattr(self, self.kind)(step)
                except AssertionError as err:
                    raise AssertionError(f"step {number} {step}: {err}") from err
                self.step_ended = clock()
            # Told once, by the end too: a release's outcome is no loss to tell.
            for name, holder in self.holders.items():
                expected = [step["reason"] for step in self.scenario["steps"] if step.get("told") == name]
                assert holder.told_reasons() == expected, f"{name} was told {holder.told_reasons()} in all"
        finally:
            # The server must answer again before the holders release.
            for resume in self.resumes:
                resume.join()
            for holder in self.holders.values():
                holder.kept.close()
                if holder.proxy is not None:
                    holder.proxy.close()
            if self.loop is not None:
                self.loop.stop()
            self.admin.close()

    def holder(self, step: dict) -> Holder:
        return self.holders[step[self.kind]]

    def hold(self, step: dict) -> None:
        name = step["hold"]
        options: Dict[str, Any] = {
            "ttl": step.get("ttl", self.scenario["ttl"]),
            "owner": name,
            "durable": step.get("durable", True),
            "session_bound": step.get("session_bound", False),
        }
        if "renew_every" in step:
            options["renew_every"] = step["renew_every"]
        proxy = Proxy(self.cluster.port) if step.get("via_proxy") else None
        port = self.cluster.port if proxy is None else proxy.port
        conninfo = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
        self.apps[name] = f"beh_{name}_{uuid.uuid4().hex[:8]}"
        told: Told = []

        def on_lost(lease: Any) -> None:
            told.append((lease.reason, clock()))

        if self.loop is None:
            kept: Any = SyncHolder(conninfo, self.apps[name], self.key, options, on_lost)
        else:
            kept = AsyncHolder(self.loop, conninfo, self.apps[name], self.key, options, on_lost)
        holder = self.holders[name] = Holder(kept, told, proxy)
        assert holder.held(), f"not held at once: {holder.state()}"

    def held(self, step: dict) -> None:
        holder = self.holder(step)
        until = time.monotonic() + step["for"]
        while time.monotonic() < until:
            assert holder.held(), f"not held: {holder.state()} ({holder.kept.read(lambda lease: lease.last_error)!r})"
            time.sleep(0.02)
        assert not holder.told, f"told {holder.told_reasons()}"

    def revoke(self, step: dict) -> None:
        assert self.admin.execute("SELECT fence.lease_revoke(%s)", (self.key,)).fetchone()[0], "nothing revoked"

    def terminate(self, step: dict) -> None:
        ended = self.admin.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = %s",
            (self.apps[step["terminate"]],),
        ).fetchone()[0]
        assert ended > 0, "no session ended"

    def stop_server_for(self, step: dict) -> None:
        self.cluster.signal_server(signal.SIGSTOP)
        resume = threading.Timer(step["stop_server_for"], self.cluster.signal_server, (signal.SIGCONT,))
        resume.start()
        self.resumes.append(resume)

    def crash_server(self, step: dict) -> None:
        self.cluster.crash()
        self.cluster.start()
        self.admin.close()
        self.admin = self.cluster.connect()

    def hang_connections(self, step: dict) -> None:
        proxy = self.holder(step).proxy
        assert proxy is not None, "the holder's connections do not go through a proxy"
        proxy.hang_existing()

    def take_over(self, step: dict) -> None:
        holder = self.holder(step)
        with psycopg.connect(self.cluster.conninfo, autocommit=True, application_name="beh_other") as conn:
            lease = pg_fence.acquire(conn, self.key, 30, wait=step["wait"])
        assert lease is not None, "not granted"
        fence = holder.kept.read(lambda lease: lease.fence)
        assert lease.fence > fence, f"granted fence {lease.fence}, not above the holder's {fence}"

    def told(self, step: dict) -> None:
        holder, within = self.holder(step), step["within"]
        # Waited for past the limit, to say how late a late telling was.
        limit = self.previous_started + within + 5 - clock()
        assert eventually(lambda: holder.told, limit), "never told"
        reason, told_at = holder.told[0]
        took = told_at - self.previous_started
        print(
            f"\n[behaviour] {self.scenario['name']} ({self.flavour}): told {reason} {took * 1000:.1f} ms"
            f" after the {self.previous_kind} began (limit {within * 1000:.0f} ms; the step itself took"
            f" {(self.previous_ended - self.previous_started) * 1000:.0f} ms)"
        )
        assert holder.told_reasons() == [step["reason"]], f"told {holder.told_reasons()}"
        lost, state, lost_at = holder.kept.read(lambda lease: (lease.lost.is_set(), lease.state, lease.lost_at))
        assert lost, "lost is not set"
        assert state == step["state"]
        assert lost_at is not None and lost_at <= told_at, "on_lost was called before the loss was declared"
        assert took <= within, f"told after {took:.3f} s, more than {within} s"
        assert not holder.held()

    def not_told(self, step: dict) -> None:
        holder = self.holder(step)
        assert not holder.told, f"told {holder.told_reasons()}"
        assert holder.held(), f"not held: {holder.state()}"

    def guard(self, step: dict) -> None:
        holder = self.holder(step)
        try:
            holder.kept.guard(self.cluster.conninfo)
            result = "ok"
        except StaleFence:
            result = "stale"
        except LeaseLost as lost:
            assert lost.__cause__ is None, "refused by the server, not by the holder before sending"
            result = "lost"
        assert result == step["result"]

    def release(self, step: dict) -> None:
        holder = self.holder(step)
        assert holder.kept.release() is step["result"]
        state, reason = holder.kept.read(lambda lease: (lease.state, lease.reason))
        assert state == step["state"]
        if "reason" in step:
            assert reason == step["reason"]


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[scenario["name"] for scenario in SCENARIOS])
def test_keeper_behaviour(keeper_cluster, scenario, flavour):
    with scenario_cluster(scenario, keeper_cluster, "keeper_behaviours_crash", 27621) as cluster:
        Run(cluster, scenario, flavour).run()
