"""The electors' behaviours (clients/behaviours/elector.json, which the Rust client's suite runs
too), each scenario run through the sync and the asyncio elector against a real server."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional

import pytest
from conftest import Cluster, Loop, behaviours, eventually, scenario_cluster, waiters

from pg_fence import Client
from pg_fence.aio import AsyncClient
from pg_fence.election import Leader

SCENARIOS = behaviours("elector.json")
LIMIT = 10.0


@pytest.fixture(scope="module")
def behaviours_cluster():
    cluster = Cluster("behaviours", 27542).create()
    yield cluster
    cluster.destroy()


def elector_options(step: dict, scenario: dict) -> dict:
    options = {"ttl": step.get("ttl", scenario["ttl"])}
    for name in ("durable", "session_bound", "lock_delay"):
        if name in step:
            options[name] = step[name]
    return options


class SyncCandidate:
    """A candidate through the sync elector: a thread campaigns, then holds the leadership in its
    block until told to leave it; a cancel is the elector's close()."""

    def __init__(self, conninfo: str, app: str, key: str, options: dict):
        self.client = Client(conninfo, application_name=app)
        self.started: List[Any] = []
        self.stopped: List[str] = []
        ttl = options.pop("ttl")
        self.elector = self.client.elector(
            key, ttl, on_started_leading=self.started.append, on_stopped_leading=self.stopped.append, **options
        )
        self.leadership: Any = None
        self.error: Optional[BaseException] = None
        self._leave = threading.Event()
        self._done = threading.Event()

    def start(self, value: str) -> None:
        threading.Thread(target=self._run, args=(value,), daemon=True).start()

    def _run(self, value: str) -> None:
        try:
            self.leadership = self.elector.campaign(value)
            with self.leadership:
                while not self._leave.is_set() and not self.leadership.lost.wait(0.02):
                    pass
        except BaseException as err:
            self.error = err
        finally:
            self._done.set()

    def proclaim(self, value: str) -> None:
        self.leadership.proclaim(value)

    def resign(self) -> bool:
        resigned = self.leadership.resign()
        self._leave.set()
        return resigned

    def handoff(self, to: str) -> Optional[Leader]:
        return self.leadership.handoff(to)

    def cancel(self) -> None:
        self.elector.close()
        assert self._done.wait(LIMIT), "the cancel did not end the campaign"

    def close(self) -> None:
        self._leave.set()
        self.elector.close()
        self._done.wait(LIMIT)
        self.client.close()


class SyncFlavour:
    def __init__(self, conninfo: str, key: str):
        self.conninfo, self.key = conninfo, key
        self.client = Client(conninfo)
        self.elector = self.client.elector(key, 5)

    def candidate(self, app: str, options: dict) -> SyncCandidate:
        return SyncCandidate(self.conninfo, app, self.key, options)

    def observe(self, seen: list) -> None:
        def run() -> None:
            for leader in self.elector.observe():
                seen.append(leader)

        threading.Thread(target=run, daemon=True).start()

    def leader(self) -> Optional[Leader]:
        return self.elector.leader()

    def close(self) -> None:
        self.elector.close()
        self.client.close()


class AsyncCandidate:
    """A candidate through the asyncio elector: a task campaigns, then holds the leadership in its
    `async with` block; a cancel cancels that task."""

    def __init__(self, loop: Loop, conninfo: str, app: str, key: str, options: dict):
        self.loop = loop
        self.started: List[Any] = []
        self.stopped: List[str] = []
        self.leadership: Any = None
        self.error: Optional[BaseException] = None
        self._task: Optional[asyncio.Task] = None

        async def make() -> None:
            self.client = AsyncClient(conninfo, application_name=app)
            ttl = options.pop("ttl")
            self.elector = self.client.elector(
                key, ttl, on_started_leading=self.started.append, on_stopped_leading=self.stopped.append, **options
            )
            self._leave = asyncio.Event()

        loop.run(make())

    def start(self, value: str) -> None:
        async def spawn() -> None:
            self._task = asyncio.get_running_loop().create_task(self._run(value))

        self.loop.run(spawn())

    async def _run(self, value: str) -> None:
        try:
            self.leadership = await self.elector.campaign(value)
            async with self.leadership:
                await self._leave.wait()
        except BaseException as err:
            self.error = err

    def proclaim(self, value: str) -> None:
        self.loop.run(self.leadership.proclaim(value))

    def resign(self) -> bool:
        async def resign() -> bool:
            resigned = await self.leadership.resign()
            self._leave.set()
            return resigned

        return self.loop.run(resign())

    def handoff(self, to: str) -> Optional[Leader]:
        return self.loop.run(self.leadership.handoff(to))

    def cancel(self) -> None:
        async def cancel() -> None:
            assert self._task is not None
            self._task.cancel()
            await asyncio.wait([self._task], timeout=LIMIT)

        self.loop.run(cancel())

    def close(self) -> None:
        async def close() -> None:
            self._leave.set()
            if self._task is not None:
                await asyncio.wait([self._task], timeout=LIMIT)
            await self.elector.close()
            await self.client.close()

        self.loop.run(close())


class AsyncFlavour:
    def __init__(self, conninfo: str, key: str):
        self.conninfo, self.key, self.loop = conninfo, key, Loop(LIMIT * 3)
        self.tasks: list = []

        async def make() -> None:
            self.client = AsyncClient(conninfo)
            self.elector = self.client.elector(key, 5)

        self.loop.run(make())

    def candidate(self, app: str, options: dict) -> AsyncCandidate:
        return AsyncCandidate(self.loop, self.conninfo, app, self.key, options)

    def observe(self, seen: list) -> None:
        async def run() -> None:
            async for leader in self.elector.observe():
                seen.append(leader)

        async def spawn() -> None:
            self.tasks.append(asyncio.get_running_loop().create_task(run()))

        self.loop.run(spawn())

    def leader(self) -> Optional[Leader]:
        return self.loop.run(self.elector.leader())

    def close(self) -> None:
        async def close() -> None:
            await self.elector.close()
            for task in self.tasks:
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            await self.client.close()

        self.loop.run(close())
        self.loop.stop()


class Run:
    """One scenario: its steps in order, against `cluster`, through `flavour`."""

    def __init__(self, cluster: Cluster, scenario: dict, flavour: Any):
        self.cluster, self.scenario, self.flavour = cluster, scenario, flavour
        self.key = flavour.key
        self.candidates: Dict[str, Any] = {}
        self.values: Dict[str, str] = {}
        self.handed: Dict[str, Leader] = {}
        self.observers: Dict[str, list] = {}
        self.read: Dict[str, int] = {}
        self.apps: Dict[str, str] = {}
        self.step_ended = time.monotonic()

    def run(self) -> None:
        try:
            for number, step in enumerate(self.scenario["steps"]):
                kind = next(iter(step))
                try:
                    getattr(self, kind)(step)
                except AssertionError as err:
                    raise AssertionError(f"step {number} {step}: {err}") from err
                self.step_ended = time.monotonic()
        finally:
            for candidate in self.candidates.values():
                candidate.close()
            self.flavour.close()

    def leader_of(self, name: Optional[str]) -> Optional[Leader]:
        if name is None:
            return None
        return Leader(self.candidates[name].leadership.fence, self.values[name])

    def observe(self, step: dict) -> None:
        seen: list = []
        self.observers[step["observe"]], self.read[step["observe"]] = seen, 0
        self.flavour.observe(seen)

    def campaign(self, step: dict) -> None:
        name = step["campaign"]
        self.apps[name] = f"beh_{name}_{uuid.uuid4().hex[:8]}"
        candidate = self.flavour.candidate(self.apps[name], elector_options(step, self.scenario))
        self.candidates[name], self.values[name] = candidate, step["value"]
        candidate.start(step["value"])

    def leads(self, step: dict) -> None:
        candidate = self.candidates[step["leads"]]
        limit = step.get("within", LIMIT)
        assert eventually(lambda: candidate.leadership is not None or candidate.error is not None, limit), (
            f"not elected within {limit} s"
        )
        assert candidate.error is None, f"the campaign failed: {candidate.error!r}"
        took = time.monotonic() - self.step_ended
        assert took >= step.get("not_before", 0), f"elected after {took:.2f} s"
        assert eventually(lambda: candidate.started == [candidate.leadership], 5), "on_started_leading not told"
        if "fence_above" in step:
            assert candidate.leadership.fence > self.candidates[step["fence_above"]].leadership.fence
        if step["leads"] in self.handed:
            assert self.handed[step["leads"]] == self.leader_of(step["leads"]), "not the lease the hand-off gave"

    def waiters(self, step: dict) -> None:
        count = lambda: waiters(self.cluster, self.key)  # noqa: E731
        assert eventually(lambda: count() == step["waiters"], LIMIT), f"{count()} waiters"

    def waits(self, step: dict) -> None:
        candidate = self.candidates[step["waits"]]
        assert candidate.leadership is None and candidate.error is None, "it is not waiting"

    def observed(self, step: dict) -> None:
        name = step["observed"]
        seen, index = self.observers[name], self.read[name]
        assert eventually(lambda: len(seen) > index, LIMIT), f"observed nothing new after {seen}"
        self.read[name] = index + 1
        assert seen[index] == self.leader_of(step["leader"]), f"observed {seen}"

    def leader(self, step: dict) -> None:
        assert self.flavour.leader() == self.leader_of(step["leader"])

    def proclaim(self, step: dict) -> None:
        self.candidates[step["proclaim"]].proclaim(step["value"])
        self.values[step["proclaim"]] = step["value"]

    def resign(self, step: dict) -> None:
        candidate = self.candidates[step["resign"]]
        found = step.get("found", "released")
        resigned = candidate.resign()
        leadership = candidate.leadership
        assert (resigned, leadership.reason) == (found == "released", None if found == "released" else found), (
            f"resign found {resigned} ({leadership.state}, {leadership.reason})"
        )

    def stopped(self, step: dict) -> None:
        candidate = self.candidates[step["stopped"]]
        assert eventually(lambda: candidate.stopped, LIMIT), "on_stopped_leading not told"
        assert candidate.stopped == [step["reason"]]

    def handoff(self, step: dict) -> None:
        leader = self.candidates[step["handoff"]].handoff(step["to"])
        if step["result"] is None:
            assert leader is None, f"handed to {leader}"
        else:
            assert leader is not None and leader.owner == self.values[step["result"]], f"handed to {leader}"
            self.handed[step["result"]] = leader

    def cancel(self, step: dict) -> None:
        self.candidates[step["cancel"]].cancel()

    def revoke(self, step: dict) -> None:
        assert self.cluster.sql("SELECT fence.lease_revoke(%s)", (self.key,))[0]

    def terminate(self, step: dict) -> None:
        pids = self.cluster.backend_pids(self.apps[step["terminate"]])
        assert pids, "no session to end"
        self.cluster.sql("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) pid", (pids,))

    def freeze_server(self, step: dict) -> None:
        self.cluster.signal_server(signal.SIGSTOP)
        try:
            time.sleep(step["freeze_server"])
        finally:
            self.cluster.signal_server(signal.SIGCONT)

    def crash_server(self, step: dict) -> None:
        self.cluster.crash()
        self.cluster.start()


FLAVOURS: Dict[str, Callable[[str, str], Any]] = {"sync": SyncFlavour, "asyncio": AsyncFlavour}


@pytest.mark.parametrize("flavour", list(FLAVOURS))
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[scenario["name"] for scenario in SCENARIOS])
def test_behaviour(behaviours_cluster, scenario, flavour):
    with scenario_cluster(scenario, behaviours_cluster, "behaviours_crash", 27543) as cluster:
        key = f"behaviours:{scenario['name']}:{flavour}:{time.monotonic_ns()}"
        Run(cluster, scenario, FLAVOURS[flavour](cluster.conninfo, key)).run()
