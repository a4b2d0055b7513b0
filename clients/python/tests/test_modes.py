"""Shared leases and semaphore permits: the options, checked before anything is sent, and passed by
name only when asked for; their leases granted, refused, kept, renewed and lost as plain ones are."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from conftest import eventually

import pg_fence
from pg_fence import Client, WaitTimedOut
from pg_fence.aio import AsyncClient
from pg_fence.lease import acquire_query

NOWHERE = "host=127.0.0.1 port=27549 user=postgres dbname=postgres"  # nothing listens there


def holders(cluster, key) -> list:
    rows = "SELECT fence, shared, permits FROM fence.leases WHERE key = %s AND live ORDER BY fence"
    with cluster.connect() as conn:
        return conn.execute(rows, (key,)).fetchall()


@pytest.mark.parametrize(
    "options, error",
    [
        ({"shared": True, "permits": 2}, ValueError),
        ({"permits": 0}, ValueError),
        ({"permits": -3}, ValueError),
        ({"permits": "2"}, TypeError),
        ({"permits": True}, TypeError),
        ({"shared": 1}, TypeError),
    ],
)
def test_modes_that_cannot_work_are_refused_before_anything_is_sent(options, error):
    # A try that reached for the server would fail to connect (ConnectFailed) instead.
    with Client(NOWHERE) as client:
        with pytest.raises(error):
            client.acquire("k", 30, **options)
        with pytest.raises(error):
            client.lease("k", 30, **options)
    with pytest.raises(error):
        pg_fence.acquire(None, "k", 30, **options)


async def test_async_modes_that_cannot_work_are_refused_before_anything_is_sent():
    async with AsyncClient(NOWHERE) as client:
        with pytest.raises(ValueError):
            await client.acquire("k", 30, shared=True, permits=3)
        with pytest.raises(ValueError):
            await client.lease("k", 30, shared=True, permits=3)


def test_modes_are_passed_by_name_and_only_when_asked_for():
    token = uuid.uuid4()
    plain, params = acquire_query("k", 30, None, 0, False, True, token)
    assert "shared" not in plain and "permits" not in plain and len(params) == 7, "a server without them fails"
    shared, params = acquire_query("k", 30, None, 0, False, True, token, shared=True)
    assert shared.endswith("%s, shared => %s)") and params[7:] == (True,)
    counted, params = acquire_query("k", 30, None, 0, False, True, token, permits=4)
    assert counted.endswith("%s, permits => %s)") and params[7:] == (4,) and type(params[7]).__name__ == "Int4"


def test_shared_leases_coexist_and_keep_an_exclusive_one_out(cluster, key):
    with Client(cluster.conninfo) as client:
        first = client.acquire(key, 30, shared=True, owner="reader-1")
        second = client.acquire(key, 30, shared=True, owner="reader-2")
        assert first is not None and second is not None, "a shared lease beside a shared one is granted"
        assert first.shared and first.token != second.token and first.fence != second.fence
        assert client.acquire(key, 30) is None, "an exclusive lease beside shared ones"
        assert client.acquire(key, 30, permits=2) is None, "a semaphore's permit beside shared ones"
        assert [row[1:] for row in holders(cluster, key)] == [(True, 1), (True, 1)]
        # Each is renewed, guarded and released with its own token and fence.
        assert client.renew(first, 60).expires_at > first.expires_at
        with cluster.connect() as conn, conn.transaction():
            pg_fence.fence_guard(conn, key, second.fence)
        assert client.release(first) and client.release(second)
        exclusive = client.acquire(key, 30)
        assert exclusive is not None and exclusive.fence > second.fence
        assert client.acquire(key, 30, shared=True) is None, "a shared lease beside an exclusive one"


def test_permits_bound_the_live_leases_of_a_key(cluster, key):
    with Client(cluster.conninfo) as client:
        granted = [client.acquire(key, 30, permits=3) for _ in range(3)]
        assert all(granted) and len({lease.token for lease in granted}) == 3
        assert client.acquire(key, 30, permits=3) is None, "a fourth permit of three"
        assert len(holders(cluster, key)) == 3 and {row[2] for row in holders(cluster, key)} == {3}
        assert client.release(granted[1])
        fourth = client.acquire(key, 30, permits=3)
        assert fourth is not None and fourth.fence > max(lease.fence for lease in granted)
        assert len(holders(cluster, key)) == 3


def test_kept_permits_are_renewed_and_a_waiter_beyond_them_times_out(cluster, key):
    with Client(cluster.conninfo) as client:
        kept = [client.lease(key, 1.0, permits=2, owner=f"worker-{n}") for n in range(2)]
        try:
            with pytest.raises(WaitTimedOut):
                client.lease(key, 30, permits=2, wait=0.3)
            before = [k.lease.expires_at for k in kept]
            assert eventually(lambda: all(k.lease.expires_at > b for k, b in zip(kept, before)), 5), "not renewed"
            assert all(k.held() for k in kept) and len(holders(cluster, key)) == 2
        finally:
            for k in kept:
                k.release()
        assert [k.state for k in kept] == ["released", "released"] and holders(cluster, key) == []


def test_a_kept_shared_lease_is_told_when_its_key_is_revoked(cluster, key):
    told = []
    with Client(cluster.conninfo) as client:
        with client.lease(key, 30, shared=True, renew_every=0.3, on_lost=lambda k: told.append(k.reason)) as lease:
            other = client.acquire(key, 30, shared=True)
            assert other is not None and lease.held()
            cluster.sql("SELECT fence.lease_revoke(%s)", (key,))
            assert lease.lost.wait(5), "the keeper never noticed the revoke"
            assert lease.state == "lost" and isinstance(lease.last_error, pg_fence.LeaseLost)
            assert eventually(lambda: told == ["revoked"], 5)
            with cluster.connect() as conn:
                with pytest.raises(pg_fence.StaleFence):
                    with conn.transaction():
                        pg_fence.fence_guard(conn, key, lease.fence)


async def test_async_kept_shared_leases_coexist(cluster, key):
    async with AsyncClient(cluster.conninfo) as client:
        first = await client.lease(key, 1.0, shared=True)
        async with first, await client.lease(key, 1.0, shared=True) as second:
            assert first.fence != second.fence
            assert await client.acquire(key, 30) is None
            with pytest.raises(psycopg.Error) as err:
                await client.acquire(key, 30, permits=20000)
            assert err.value.sqlstate == "22023", "the server's bound on permits is the server's error"
        assert holders(cluster, key) == []
