"""How the client keeps leases at scale (clients/behaviours/keeping.json, which every client runs):
each scenario through the sync and the asyncio client against a real server. Prints the
connections and the renewal latency of the keeper's scenario."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import queue
import statistics
import threading
import time
import uuid
from typing import Any, Dict, List, Optional

import psycopg
import psycopg_pool
import pytest
from conftest import Cluster, Loop, behaviours, eventually
from proxy import Proxy

from pg_fence import Blind, Client, OutcomeUnknown, Retry
from pg_fence.aio import AsyncClient
from pg_fence.holding import clock

SCENARIOS = behaviours("keeping.json")


@pytest.fixture(scope="module")
def keeping_cluster():
    cluster = Cluster("keeping_behaviours", 27622).create()
    yield cluster
    cluster.destroy()


class Party:
    """A client of the scenario (`beh_<name>`), its kept leases, what it was told, its pool, proxy
    and observer."""

    def __init__(self, client: Any, app: str, pool: Any = None, proxy: Optional[Proxy] = None):
        self.client, self.app, self.pool, self.proxy = client, app, pool, proxy
        self.leases: List[Any] = []
        self.told: List[str] = []
        self.hogged: List[Any] = []
        self.pending: Any = None
        self.seen: List[Any] = []
        self.observing: Any = None
        self.elector: Any = None

    def on_lost(self, lease: Any) -> None:
        self.told.append(f"{lease.key}: {lease.reason}")


class Run:
    """One scenario: its steps in order, through the `flavour` of client."""

    def __init__(self, cluster: Cluster, scenario: dict, flavour: str):
        self.cluster, self.scenario, self.flavour = cluster, scenario, flavour
        self.key = f"keeping:{scenario['name']}:{flavour}:{time.monotonic_ns()}"
        self.loop = Loop(limit=60) if flavour == "asyncio" else None
        self.parties: Dict[str, Party] = {}
        self.step_started = self.step_ended = self.previous_started = self.previous_ended = clock()
        self.others: List[psycopg.Connection] = []
        self.admin = cluster.connect()

    def run(self) -> None:
        try:
            for number, step in enumerate(self.scenario["steps"]):
                kind = next(iter(step))
                handler = getattr(self, f"step_{kind}", None)
                assert handler is not None, f"step {number}: unknown step {kind!r}"
                self.previous_started, self.previous_ended = self.step_started, self.step_ended
                self.step_started = clock()
                try:
                    handler(step)
                except AssertionError as err:
                    raise AssertionError(f"step {number} {step}: {err}") from err
                self.step_ended = clock()
        finally:
            for party in self.parties.values():
                self.close(party)
            for conn in self.others:
                conn.close()
            if self.loop is not None:
                self.loop.stop()
            self.admin.close()

    def do(self, result: Any) -> Any:
        """A call's result, run on the loop when it is a coroutine (the asyncio client's)."""
        if inspect.iscoroutine(result):
            assert self.loop is not None
            return self.loop.run(result)
        return result

    def conninfo(self, port: Optional[int] = None) -> str:
        return f"host=127.0.0.1 port={port or self.cluster.port} user=postgres dbname=postgres"

    def party(self, name: str, pool: int = 0, proxy: bool = False, **options: Any) -> Party:
        if name in self.parties:
            return self.parties[name]
        app = f"beh_{name}_{uuid.uuid4().hex[:8]}"
        through = Proxy(self.cluster.port) if proxy else None
        conninfo = self.conninfo(through.port if through else None)
        kwargs = {"autocommit": True, "application_name": app}
        made: Any = None
        if self.loop is None:
            made = (
                psycopg_pool.ConnectionPool(conninfo, min_size=pool, max_size=pool, kwargs=kwargs, open=True)
                if pool
                else None
            )
            client: Any = Client(conninfo, pool=made, application_name=app, **options)
        else:

            async def make() -> Any:
                nonlocal made
                if pool:
                    made = psycopg_pool.AsyncConnectionPool(
                        conninfo, min_size=pool, max_size=pool, kwargs=kwargs, open=False
                    )
                    await made.open(wait=True)
                return AsyncClient(conninfo, pool=made, application_name=app, **options)

            client = self.loop.run(make())
        self.parties[name] = Party(client, app, made, through)
        return self.parties[name]

    def close(self, party: Party) -> None:
        if party.pending is not None and not party.pending.done():
            party.pending.cancel()
        if party.observing is not None:
            self.loop.loop.call_soon_threadsafe(party.observing.cancel)
        for conn in party.hogged:
            self.do(party.pool.putconn(conn))
        for lease in party.leases:
            self.do(lease.release())
        if party.elector is not None:
            self.do(party.elector.close())
        self.do(party.client.close())
        if party.pool is not None:
            self.do(party.pool.close())
        if party.proxy is not None:
            party.proxy.close()

    def keeper_connections(self, party: Party) -> int:
        return self.admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (f"{party.app} keeper",)
        ).fetchone()[0]

    def read(self, lease: Any, what: str) -> Any:
        """A kept lease's attribute, read on the loop for the asyncio one: reading its state may
        declare it lost, which only the loop may do."""
        if self.loop is None:
            return getattr(lease, what)

        async def read() -> Any:
            return getattr(lease, what)

        return self.loop.run(read())

    def all_states(self, party: Party) -> List[str]:
        if self.loop is None:
            return [lease.state for lease in party.leases]

        async def read() -> List[str]:
            return [lease.state for lease in party.leases]

        return self.loop.run(read())

    def keep_held(self, party: Party, seconds: float) -> None:
        end = clock() + seconds
        while True:
            states = self.all_states(party)
            lost = [state for state in states if state != "held"]
            assert not lost and not party.told, f"{len(lost)} of {len(states)} not held; told {party.told[:5]}"
            if clock() >= end:
                return
            time.sleep(min(0.1, max(0.0, end - clock())))

    def step_hold_many(self, step: dict) -> None:
        party = self.party(step["hold_many"], keeper_connections=step["keeper_connections"])
        for index in range(step["count"]):
            lease = self.do(party.client.lease(f"{self.key}-{index}", step["ttl"], on_lost=party.on_lost))
            party.leases.append(lease)
        self.keep_held(party, 0)

    def step_all_held(self, step: dict) -> None:
        party = self.parties[step["all_held"]]
        keeper = party.client.keeper()
        keeper.latencies.clear()
        self.keep_held(party, step["for"])
        latencies = sorted(keeper.latencies)
        assert latencies, "no renewal was made"
        p50 = statistics.median(latencies) * 1000
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000
        print(
            f"[behaviour] {self.scenario['name']} ({self.flavour}): {len(party.leases)} leases kept over "
            f"{self.keeper_connections(party)} connections, renewals p50 {p50:.1f} ms, p99 {p99:.1f} ms"
            f" ({len(latencies)} renewals)"
        )

    def step_connections(self, step: dict) -> None:
        party = self.parties[step["connections"]]
        counted = self.keeper_connections(party)
        lanes = party.client.keeper().lanes
        assert counted <= step["at_most"], f"{counted} connections of the keeper"
        assert lanes.made <= step["at_most"], f"the keeper made {lanes.made} connections"

    def step_hold(self, step: dict) -> None:
        party = self.party(step["hold"], pool=step.get("pool", 0))
        lease = self.do(party.client.lease(self.key, step["ttl"], owner=step["hold"], on_lost=party.on_lost))
        party.leases.append(lease)
        assert self.read(lease, "state") == "held"

    def step_hog_pool(self, step: dict) -> None:
        party = self.parties[step["hog_pool"]]
        for _ in range(party.pool.max_size):
            party.hogged.append(self.do(party.pool.getconn(timeout=5)))

    def step_release_pool(self, step: dict) -> None:
        party = self.parties[step["release_pool"]]
        for conn in party.hogged:
            self.do(party.pool.putconn(conn))
        party.hogged.clear()

    def step_held(self, step: dict) -> None:
        self.keep_held(self.parties[step["held"]], step["for"])

    def step_release(self, step: dict) -> None:
        party = self.parties[step["release"]]
        lease = party.leases.pop()
        assert self.do(lease.release()) is step["result"]

    def step_acquire_waiting(self, step: dict) -> None:
        name = step["acquire_waiting"]
        # The retries' longest time when the step gives it; the client's default otherwise.
        retry = {"retry": Retry(total=step["retry_for"])} if "retry_for" in step else {}
        if self.loop is None:
            if retry:
                party = self.party(name, proxy=True, call_timeout=10, **retry)
            else:
                # A sync call cannot be cancelled from outside: its caller gives up by a timeout,
                # with no retry (a retry by its token would get the lease back).
                party = self.party(name, proxy=True, call_timeout=1, retry=Retry(attempts=0))
            pending: Any = concurrent.futures.Future()

            def acquire() -> None:
                try:
                    pending.set_result(party.client.lease(self.key, step["ttl"], wait=step["wait"]))
                except BaseException as err:
                    pending.set_exception(err)

            threading.Thread(target=acquire, daemon=True).start()
        else:
            party = self.party(name, proxy=True, **retry)
            pending = asyncio.run_coroutine_threadsafe(
                party.client.lease(self.key, step["ttl"], wait=step["wait"]), self.loop.loop
            )
        party.pending = pending

    def step_pause(self, step: dict) -> None:
        time.sleep(step["pause"])

    def step_terminate(self, step: dict) -> None:
        app = self.parties[step["terminate"]].app
        ended = self.admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name LIKE %s || '%%'",
            (app,),
        ).fetchone()[0]
        assert ended > 0, "no session of the client to end"

    def step_granted(self, step: dict) -> None:
        party = self.parties[step["granted"]]
        pending, party.pending = party.pending, None
        assert pending is not None, "no acquire running"
        try:
            lease = pending.result(step["within"])
        except concurrent.futures.TimeoutError:
            party.pending = pending
            raise AssertionError(f"no answer within {step['within']} s") from None
        except Exception as err:
            raise AssertionError(f"the acquire failed: {err!r}") from err
        assert lease is not None, "the acquire returned no lease"
        party.leases.append(lease)
        assert self.read(lease, "state") == "held", f"not held: {self.read(lease, 'state')}"

    def step_waiters(self, step: dict) -> None:
        assert eventually(
            lambda: self.admin.execute("SELECT fence.waiters(%s)", (self.key,)).fetchone()[0] == step["waiters"], 10
        ), "not as many waiters"

    def step_hang_connections(self, step: dict) -> None:
        proxy = self.parties[step["hang_connections"]].proxy
        assert proxy is not None, "the client's connections do not go through a proxy"
        proxy.hang_existing()

    def step_release_other(self, step: dict) -> None:
        other = self.parties[step["by"]]
        assert self.do(other.leases.pop().release()) is True
        # Granted on the server: the waiter's backend grants itself once woken.
        assert eventually(lambda: self.live([self.key]) == 1, 10), "the waiting acquire was not granted"

    def step_give_up(self, step: dict) -> None:
        party = self.parties[step["give_up"]]
        pending = party.pending
        if self.loop is not None:
            pending.cancel()
            expected: Any = concurrent.futures.CancelledError
        else:
            expected = OutcomeUnknown
        try:
            lease = pending.result(60)
        except expected:
            return
        party.leases.append(lease)
        raise AssertionError(f"the given-up call returned {lease}")

    def step_key_free(self, step: dict) -> None:
        def free() -> bool:
            return (
                self.admin.execute("SELECT count(*) FROM fence.leases WHERE key = %s AND live", (self.key,)).fetchone()[
                    0
                ]
                == 0
            )

        assert eventually(free, step["within"] - (clock() - self.previous_ended)), "the key is still held"

    def live(self, keys: List[str]) -> int:
        return self.admin.execute("SELECT count(*) FROM fence.leases WHERE key = ANY(%s) AND live", (keys,)).fetchone()[
            0
        ]

    def step_hold_other(self, step: dict) -> None:
        conn = psycopg.connect(self.cluster.conninfo, autocommit=True, application_name="beh_other")
        self.others.append(conn)
        row = conn.execute(
            "SELECT fence FROM fence.lease_acquire(%s, interval '1 hour')", (f"{self.key}-{step['index']}",)
        ).fetchone()
        assert row is not None and row[0] is not None, "not granted"

    def step_hold_first_free(self, step: dict) -> None:
        party = self.party(step["hold_first_free"])
        keys = [f"{self.key}-{index}" for index in range(step["count"])]
        before = self.live(keys)
        lease = self.do(party.client.lease_first_free(keys, step["ttl"], on_lost=party.on_lost))
        if step["got"] is None:
            assert lease is None, f"got {lease and lease.key}"
            assert self.live(keys) == before, "a lease was left held"
            return
        assert lease is not None, "none was granted"
        party.leases.append(lease)
        assert lease.key == keys[step["got"]], f"got {lease.key}"

    def step_lead(self, step: dict) -> None:
        name = step["lead"]
        party = self.party(name)
        party.elector = party.client.elector(self.key, step["ttl"])
        party.leases.append(self.do(party.elector.campaign(name, wait=10)))

    def step_observe(self, step: dict) -> None:
        name = step["observe"]
        party = self.party(name, proxy=True)
        seen: "queue.Queue[Any]" = queue.Queue()
        party.seen = seen

        if self.loop is None:
            elector = party.client.elector(self.key, step["ttl"])

            def watch() -> None:
                with contextlib.suppress(Exception):
                    for news in elector.observe():
                        seen.put((news, clock()))

            threading.Thread(target=watch, daemon=True).start()
        else:

            async def start() -> Any:
                elector = party.client.elector(self.key, step["ttl"])

                async def watch() -> None:
                    with contextlib.suppress(Exception):
                        async for news in elector.observe():
                            seen.put((news, clock()))

                return asyncio.get_running_loop().create_task(watch())

            party.observing = self.loop.run(start())
        party.elector = elector if self.loop is None else None

    def step_observed(self, step: dict) -> None:
        news, _ = self.parties[step["observed"]].seen.get(timeout=10)
        expected = step["leader"]
        if expected is None:
            assert news is None, f"told {news}"
        else:
            assert not isinstance(news, Blind) and news is not None, f"told {news}"
            assert news.owner == expected, f"told {news}"

    def step_blind(self, step: dict) -> None:
        seen = self.parties[step["blind"]].seen
        limit = self.previous_started + step["within"]
        news, at = seen.get(timeout=max(0.1, limit - clock() + 1))
        assert isinstance(news, Blind), f"told {news} first"
        assert at <= limit, f"told it cannot see {at - self.previous_started:.2f} s after the hang"
        print(f"[behaviour] {self.scenario['name']} ({self.flavour}): blind after {at - self.previous_started:.2f} s")


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s["name"] for s in SCENARIOS])
def test_keeping_behaviour(keeping_cluster, scenario, flavour):
    Run(keeping_cluster, scenario, flavour).run()
