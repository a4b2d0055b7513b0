"""The asyncio API against a real server: calls, a kept lease, takeover and an unreachable server."""

from __future__ import annotations

import asyncio
import signal
import time

import psycopg
import pytest

from pg_fence import LeaseLost, StaleFence, WaitTimedOut
from pg_fence.aio import AsyncClient, fenced_update
from pg_fence.aio_connections import AsyncLanes
from pg_fence.holding import clock


async def test_async_calls_round_trip(cluster, key):
    async with AsyncClient(cluster.conninfo) as client:
        lease = await client.acquire(key, 30)
        assert lease is not None and await client.current_fence(key) == lease.fence
        assert await client.acquire(key, 30) is None
        assert (await client.renew(lease, 60)).expires_at > lease.expires_at
        assert await client.release(lease) and not await client.release(lease)
        with pytest.raises(LeaseLost):
            await client.renew(lease, 30)
        with pytest.raises(psycopg.Error) as err:
            await client.acquire("", 30)
        assert err.value.sqlstate == "22023"


async def test_async_kept_lease_renews_and_is_told_of_a_takeover(cluster, key):
    async with AsyncClient(cluster.conninfo) as client:
        async with await client.lease(key, 1.0) as lease:
            await asyncio.sleep(2.5)
            assert lease.held()
            with pytest.raises(WaitTimedOut):
                await client.lease(key, 30, wait=0.1)
            revoked = clock()
            cluster.sql("SELECT fence.lease_revoke(%s)", (key,))
            assert await client.acquire(key, 30)
            await asyncio.wait_for(lease.lost.wait(), 5)
            print(f"\nasync takeover: told {1000 * (lease.lost_at - revoked):.0f} ms after the revoke")
            assert (lease.state, lease.reason) == ("lost", "revoked")
            async with await psycopg.AsyncConnection.connect(cluster.conninfo, autocommit=True) as conn:
                with pytest.raises(StaleFence):
                    await fenced_update(conn, key, lease.fence, "pg_class", {"relname": "x"}, {"oid": 0})


@pytest.mark.port(27520)
async def test_async_stopped_server_is_declared_unknown(own_cluster, key):
    client = AsyncClient(own_cluster.conninfo)
    lease = await client.lease(key, 2.0, renew_every=1.5)
    expiry = own_cluster.sql("SELECT expires_at FROM fence.leases WHERE key = %s", (key,))[0]
    own_cluster.signal_server(signal.SIGSTOP)
    try:
        await asyncio.wait_for(lease.lost.wait(), 10)
        assert (lease.state, lease.reason) == ("unknown", "unreachable") and not lease.held()
    finally:
        own_cluster.signal_server(signal.SIGCONT)
    assert time.time() - (clock() - lease.deadline) < expiry.timestamp()
    assert lease.lost_at - lease.deadline < 1.0
    await lease.release()
    await client.close()


async def test_async_release_whose_connection_broke_is_retried_on_a_new_one(cluster, key):
    async with AsyncClient(cluster.conninfo, application_name="async_broken_release") as client:
        lease = await client.lease(key, 30)
        (pid,) = cluster.backend_pids("async_broken_release")
        cluster.sql("SELECT pg_terminate_backend(%s)", (pid,))
        assert await lease.release() is True, "the release was not tried again on a new connection"
        assert lease.state == "released"
        assert cluster.sql("SELECT count(*) FROM fence.leases WHERE key = %s AND live", (key,)) == (0,)


async def test_a_closed_async_keeper_leaves_a_connection_in_use_to_the_call_using_it(cluster):
    # As test_keeper's: closed under a call still waiting on it, libpq's connection is used after free.
    lanes = AsyncLanes(cluster.conninfo, 2)
    busy, idle = await lanes.checkout(), await lanes.checkout()
    await lanes.checkin(idle, None)
    await lanes.shut()
    assert idle.closed, "an idle connection outlived the keeper"
    assert not busy.closed, "the keeper closed a connection a call was using"
    assert await (await busy.execute("SELECT 1")).fetchone() == (1,)
    await lanes.checkin(busy, None)
    assert busy.closed, "a connection handed back to a closed keeper was kept"
