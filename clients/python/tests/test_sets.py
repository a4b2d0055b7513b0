"""Lease sets: every key or none, renewed and released in one call each, kept as one lease is (the
local deadline, lost as a whole when one of its leases is), and an acquire that is never sent again
after a try that may have been granted (lease_acquire_all takes no token)."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest
from conftest import eventually
from proxy import Proxy

import pg_fence
from pg_fence import Client, LeaseLost, OutcomeUnknown, Retry, StaleFence, WaitTimedOut
from pg_fence.aio import AsyncClient


def live(cluster, keys) -> dict:
    rows = "SELECT key, fence FROM fence.leases WHERE key = ANY(%s) AND live"
    with cluster.connect() as conn:
        return dict(conn.execute(rows, (list(keys),)).fetchall())


def set_keys(key: str) -> list:
    return [f"{key}:b", f"{key}:a", f"{key}:c"]


def test_acquire_all_grants_every_key_or_none(cluster, key):
    keys = set_keys(key)
    with Client(cluster.conninfo) as client:
        granted = client.acquire_all(keys, 30, owner="mover")
        assert granted is not None and granted.keys == tuple(sorted(keys)), "one lease per key, in key order"
        assert {lease.token for lease in granted.leases} == {granted.token}
        assert all(lease.owner == "mover" for lease in granted.leases)
        assert live(cluster, keys) == granted.fences
        assert client.acquire_all([keys[0], f"{key}:d"], 30) is None, "none when one of them is held"
        assert live(cluster, [f"{key}:d"]) == {}
        assert client.acquire(keys[1], 30) is None
        renewed = client.renew_all(granted, 60)
        assert renewed.fences == granted.fences and renewed.expires_at > granted.expires_at
        assert client.release_all(granted) == 3 and client.release_all(granted) == 0
        with pytest.raises(LeaseLost) as lost:
            client.renew_all(granted, 30)
        assert lost.value.key == granted.label
        again = client.acquire_all(keys, 30)
        assert all(again.fences[k] > granted.fences[k] for k in keys)
        client.release_all(again)


@pytest.mark.parametrize("keys", [[], ["x", "x"], ["x", ""]])
def test_bad_sets_are_the_servers_error(cluster, keys):
    with Client(cluster.conninfo) as client:
        with pytest.raises(psycopg.Error) as err:
            client.acquire_all(keys, 30)
        assert err.value.sqlstate == "22023"


def test_keys_given_as_a_string_are_refused_before_anything_is_sent():
    with Client("host=127.0.0.1 port=27549 user=postgres dbname=postgres") as client:
        with pytest.raises(TypeError):
            client.acquire_all("ab", 30)
        with pytest.raises(TypeError):
            client.lease_set("ab", 30)


def test_a_kept_set_outlives_its_ttl_and_is_released_on_exit(cluster, key):
    keys = set_keys(key)
    with Client(cluster.conninfo) as client:
        with client.lease_set(keys, 1.0) as kept:
            assert kept.keys == tuple(sorted(keys)) and kept.lease_set.fences == kept.fences
            first = kept.lease.expires_at
            with pytest.raises(AttributeError):
                kept.fence  # noqa: B018 (a set has a fence per key)
            assert eventually(lambda: kept.lease.expires_at > first, 5), "never renewed"
            with cluster.connect() as conn:
                for k in keys:
                    with conn.transaction():
                        kept.guard(conn, k)
                with pytest.raises(KeyError):
                    kept.guard(conn, f"{key}:elsewhere")
            time.sleep(2.0)
            assert kept.held() and live(cluster, keys) == kept.fences
        assert kept.state == "released" and live(cluster, keys) == {}


def test_a_kept_set_is_lost_as_a_whole_when_one_key_is_revoked(cluster, key):
    keys = set_keys(key)
    told = []
    with Client(cluster.conninfo) as client:
        with client.lease_set(
            keys, 30, renew_every=0.3, on_lost=lambda kept: told.append((kept.state, kept.reason))
        ) as kept:
            fences = kept.fences
            cluster.sql("SELECT fence.lease_revoke(%s)", (keys[0],))
            assert kept.lost.wait(5), "the keeper never noticed that one lease of the set was revoked"
            assert kept.state == "lost" and isinstance(kept.last_error, LeaseLost)
            assert eventually(lambda: told == [("lost", "revoked")], 5), "on_lost was called once, with the reason"
            with pytest.raises(LeaseLost) as lost:
                kept.check()
            assert lost.value.reason == "revoked"
            # The rest of the set is given up at once, not left held until its TTL.
            assert eventually(lambda: live(cluster, keys) == {}, 5), "the set's other leases were left live"
            with cluster.connect() as conn:
                with pytest.raises(StaleFence):
                    with conn.transaction():
                        pg_fence.fence_guard(conn, keys[1], fences[keys[1]])
        assert kept.state == "lost"


def test_a_stale_fence_of_one_key_ends_the_kept_set_and_frees_the_others(cluster, key):
    keys = set_keys(key)
    with Client(cluster.conninfo) as client:
        with client.lease_set(keys, 30) as kept:  # the keeper renews in 10 s: it has heard nothing yet
            cluster.sql("SELECT fence.lease_revoke(%s)", (keys[2],))
            with cluster.connect() as conn:
                with pytest.raises(StaleFence):
                    with conn.transaction():
                        kept.guard(conn, sorted(keys)[2])
            assert kept.lost.is_set() and kept.state == "lost" and kept.reason == "revoked"
        assert live(cluster, keys) == {}, "leaving the block did not give up the rest of a lost set"


def test_a_set_is_granted_only_when_every_key_is_free(cluster, key):
    keys = set_keys(key)
    with Client(cluster.conninfo) as client:
        blocker = client.acquire(keys[2], 30)
        with pytest.raises(WaitTimedOut):
            client.lease_set(keys, 30, wait=0.3)
        assert live(cluster, keys) == {keys[2]: blocker.fence}, "a set holds none of its keys while it waits"
        client.release(blocker)
        with client.lease_set(keys, 30, wait=5) as kept:
            assert set(kept.keys) == set(keys)


def test_a_lost_reply_of_acquire_all_is_not_sent_again(cluster, key):
    keys = set_keys(key)
    proxy = Proxy(cluster.port)
    conninfo = f"host=127.0.0.1 port={proxy.port} user=postgres dbname=postgres"
    with Client(conninfo, retry=Retry(attempts=3, base=0.01)) as client:
        for call in (lambda: client.acquire_all(keys, 2), lambda: client.lease_set(keys, 2)):
            client.current_fence("warm-up")  # the connection exists before the reply is dropped
            dropped, proxy.drop_reply_after = proxy.dropped, b"lease_acquire_all"
            # Sent again, the try would find the keys held by the lost grant and return None (or
            # raise WaitTimedOut): the caller would not know that they are held, nor by whom.
            with pytest.raises(OutcomeUnknown):
                call()
            assert proxy.dropped == dropped + 1, "the proxy lost the reply"
            assert set(live(cluster, keys)) == set(keys), "the lost try was granted"
            assert eventually(lambda: live(cluster, keys) == {}, 10), "the lost grant ends at its TTL"
    proxy.close()


def test_a_session_bound_kept_set_is_lost_when_its_session_ends(cluster, key):
    keys = set_keys(key)
    with Client(cluster.conninfo, application_name="set_session") as client:
        with client.lease_set(keys, 30, session_bound=True) as kept:
            (pid,) = cluster.backend_pids("set_session")
            cluster.sql("SELECT pg_terminate_backend(%s)", (pid,))
            assert kept.lost.wait(5) and kept.state == "lost"  # the next renewal is 10 s away
            assert eventually(lambda: live(cluster, keys) == {})


async def test_async_kept_set_renews_and_is_lost_when_one_key_is_revoked(cluster, key):
    keys = set_keys(key)
    async with AsyncClient(cluster.conninfo) as client:
        granted = await client.acquire_all(keys, 30)
        assert granted is not None and await client.release_all(granted) == 3
        async with await client.lease_set(keys, 1.0) as kept:
            first = kept.lease.expires_at
            await asyncio.sleep(1.5)
            assert kept.held() and kept.lease.expires_at > first
            async with await psycopg.AsyncConnection.connect(cluster.conninfo, autocommit=True) as conn:
                await kept.guard(conn, keys[0])
            cluster.sql("SELECT fence.lease_revoke(%s)", (keys[1],))
            await asyncio.wait_for(kept.lost.wait(), 5)
            assert kept.state == "lost" and isinstance(kept.last_error, LeaseLost)
            assert kept.reason == "revoked"
        assert live(cluster, keys) == {}
