"""The Observer hook and pg_fence.prometheus against a real server, read from a CollectorRegistry:
acquires timed by outcome, kept leases counted up and down, renewals timed, a loss counted with its
reason, the leader gauge; in the sync client and the asyncio one."""

from __future__ import annotations

import asyncio
import importlib
import sys
import time
import uuid
from typing import Iterator

import pytest
from conftest import Cluster, eventually

from pg_fence import Client
from pg_fence.aio import AsyncClient

prometheus_client = pytest.importorskip("prometheus_client")

from pg_fence.prometheus import PrometheusObserver  # noqa: E402


@pytest.fixture(scope="module")
def metrics_cluster() -> Iterator[Cluster]:
    cluster = Cluster("metrics", 27623).create()
    yield cluster
    cluster.destroy()


def fresh(name: str) -> str:
    return f"metrics:{name}:{uuid.uuid4()}"


def value(registry, name: str, **labels: str) -> float:
    got = registry.get_sample_value(name, labels)
    assert got is not None, f"no {name}{labels}"
    return got


def observed(cluster: Cluster):
    registry = prometheus_client.CollectorRegistry()
    return registry, PrometheusObserver(registry)


def test_acquires_are_timed_by_outcome(metrics_cluster):
    registry, observer = observed(metrics_cluster)
    key = fresh("acquire")
    assert value(registry, "pgfence_acquire_duration_seconds_count", outcome="granted") == 0
    with Client(metrics_cluster.conninfo, observer=observer) as client:
        lease = client.acquire(key, 30)
        assert lease is not None
        assert client.acquire(key, 30, wait=0.2) is None
        assert value(registry, "pgfence_acquire_duration_seconds_count", outcome="granted") == 1
        assert value(registry, "pgfence_acquire_duration_seconds_sum", outcome="granted") > 0
        assert value(registry, "pgfence_acquire_duration_seconds_count", outcome="refused") == 1
        # The refused acquire waited 0.2 s for the key: its time counts the wait.
        assert value(registry, "pgfence_acquire_duration_seconds_sum", outcome="refused") >= 0.199
        assert value(registry, "pgfence_acquire_duration_seconds_count", outcome="error") == 0
        client.release(lease)


def test_kept_leases_are_counted_up_and_down_and_renewals_timed(metrics_cluster):
    registry, observer = observed(metrics_cluster)
    with Client(metrics_cluster.conninfo, observer=observer) as client:
        assert value(registry, "pgfence_leases_kept") == 0
        a = client.lease(fresh("kept-a"), 0.9)
        b = client.lease(fresh("kept-b"), 0.9)
        assert value(registry, "pgfence_leases_kept") == 2
        # Renewed every 0.3 s: the keeper's calls are timed, with how many leases each renewed.
        assert eventually(lambda: value(registry, "pgfence_renew_duration_seconds_count", outcome="ok") >= 2, 30)
        assert value(registry, "pgfence_renew_leases_sum") >= 2
        assert value(registry, "pgfence_renew_duration_seconds_count", outcome="lost") == 0
        a.release()
        assert value(registry, "pgfence_leases_kept") == 1
        b.release()
        b.release()
        assert value(registry, "pgfence_leases_kept") == 0, "ended once"
        for reason in ("expired", "revoked", "taken_over", "session_ended", "restarted", "unreachable", "unknown"):
            assert value(registry, "pgfence_lease_losses_total", reason=reason) == 0, "a release is no loss"


def test_a_session_bound_leases_renewals_are_timed_too(metrics_cluster):
    registry, observer = observed(metrics_cluster)
    with Client(metrics_cluster.conninfo, observer=observer) as client:
        # Renewed on its own session, not by the keeper's batches.
        with client.lease(fresh("bound"), 0.9, session_bound=True) as lease:
            assert value(registry, "pgfence_leases_kept") == 1
            assert eventually(lambda: value(registry, "pgfence_renew_duration_seconds_count", outcome="ok") >= 2, 30)
            assert lease.held()
        assert value(registry, "pgfence_leases_kept") == 0


def test_a_loss_is_counted_with_its_reason(metrics_cluster):
    registry, observer = observed(metrics_cluster)
    key = fresh("loss")
    with Client(metrics_cluster.conninfo, observer=observer) as client:
        lease = client.lease(key, 0.9)
        assert value(registry, "pgfence_leases_kept") == 1
        assert value(registry, "pgfence_lease_losses_total", reason="revoked") == 0
        metrics_cluster.sql("SELECT fence.lease_revoke(%s)", (key,))
        assert lease.lost.wait(30)
        assert lease.reason == "revoked"
        assert eventually(lambda: value(registry, "pgfence_lease_losses_total", reason="revoked") == 1, 30)
        assert eventually(lambda: value(registry, "pgfence_renew_duration_seconds_count", outcome="lost") == 1, 30)
        assert value(registry, "pgfence_leases_kept") == 0
        lease.release()
        assert value(registry, "pgfence_lease_losses_total", reason="revoked") == 1
        assert value(registry, "pgfence_lease_losses_total", reason="expired") == 0


def test_the_leader_gauge_is_1_while_leading(metrics_cluster):
    registry, observer = observed(metrics_cluster)
    election = fresh("election")
    with Client(metrics_cluster.conninfo, observer=observer) as client:
        with client.elector(election, 5) as elector:
            assert registry.get_sample_value("pgfence_leader", {"election": election}) is None
            leadership = elector.campaign("node-1")
            assert value(registry, "pgfence_leader", election=election) == 1
            assert value(registry, "pgfence_leases_kept") == 1, "a leadership is a kept lease"
            assert leadership.resign()
            assert eventually(lambda: value(registry, "pgfence_leader", election=election) == 0, 30)
            assert value(registry, "pgfence_leases_kept") == 0


def test_the_asyncio_client_tells_the_same(metrics_cluster):
    registry, observer = observed(metrics_cluster)
    key, election = fresh("async"), fresh("async-election")

    async def main() -> None:
        async with AsyncClient(metrics_cluster.conninfo, observer=observer) as client:
            lease = await client.lease(key, 0.9)
            assert value(registry, "pgfence_acquire_duration_seconds_count", outcome="granted") == 1
            assert value(registry, "pgfence_leases_kept") == 1
            assert await client.acquire(key, 30) is None
            assert value(registry, "pgfence_acquire_duration_seconds_count", outcome="refused") == 1
            end = time.monotonic() + 30
            while value(registry, "pgfence_renew_duration_seconds_count", outcome="ok") < 1:
                assert time.monotonic() < end, "no renewal within 30 s"
                await asyncio.sleep(0.01)
            metrics_cluster.sql("SELECT fence.lease_revoke(%s)", (key,))
            await asyncio.wait_for(lease.lost.wait(), 30)
            while value(registry, "pgfence_lease_losses_total", reason="revoked") != 1:
                assert time.monotonic() < end + 30, "the loss not counted within 30 s"
                await asyncio.sleep(0.01)
            assert value(registry, "pgfence_leases_kept") == 0
            await lease.release()
            async with client.elector(election, 5) as elector:
                leadership = await elector.campaign("node-1")
                assert value(registry, "pgfence_leader", election=election) == 1
                assert await leadership.resign()
                while value(registry, "pgfence_leader", election=election) != 0:
                    assert time.monotonic() < end + 60, "the leader gauge not back to 0 within 30 s"
                    await asyncio.sleep(0.01)

    asyncio.run(main())


def test_labels_tell_two_clients_apart(metrics_cluster):
    registry = prometheus_client.CollectorRegistry()
    observer = PrometheusObserver(registry, labels={"client": "orders"})
    with Client(metrics_cluster.conninfo, observer=observer) as client:
        with client.lease(fresh("labelled"), 5):
            assert value(registry, "pgfence_leases_kept", client="orders") == 1
        assert value(registry, "pgfence_leases_kept", client="orders") == 0


def test_without_prometheus_client_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.delitem(sys.modules, "pg_fence.prometheus")
    with pytest.raises(ImportError, match=r"pip install 'pg-fence\[prometheus\]'"):
        importlib.import_module("pg_fence.prometheus")
