"""Why a lease was lost, as the calls tell it (LeaseLost.reason) and lease_status: a revoke, an expiry,
a takeover, a release, a token the server never saw. What the kept lease tells (reason, on_lost),
under a crash of the server or past its deadline too, is keeper.json's (test_keeper_behaviours.py)."""

from __future__ import annotations

import time
import uuid

import pytest

from pg_fence import Client, LeaseLost
from pg_fence.aio import AsyncClient
from pg_fence.reasons import ended_reason, loss_reason


def test_the_servers_reasons_as_the_client_tells_them():
    assert ended_reason([("live", None)], True) is None
    assert ended_reason([("ended", "revoked")], True) == "revoked"
    assert ended_reason([("ended", "unknown")], True) == "unknown"
    assert ended_reason([("ended", "unknown")], False) == "restarted", "a fast lease the server forgot"
    assert ended_reason([("live", None), ("ended", "expired"), ("ended", "revoked")], True) == "expired"
    assert loss_reason([("ended", "released")], True, "unknown") == "unknown", "released with our token by another"
    assert loss_reason([("live", None)], True, "session_ended") == "session_ended"


def lost_reason(client: Client, lease) -> str:
    with pytest.raises(LeaseLost) as lost:
        client.renew(lease, 30)
    return lost.value.reason


def test_renew_says_why_the_lease_was_lost(cluster, key):
    with Client(cluster.conninfo) as client:
        revoked = client.acquire(f"{key}:revoked", 30)
        assert client.status(revoked.key, revoked.token).live
        cluster.sql("SELECT fence.lease_revoke(%s)", (revoked.key,))
        assert lost_reason(client, revoked) == "revoked"

        expired = client.acquire(f"{key}:expired", 0.5)
        taken = client.acquire(f"{key}:taken", 0.5)
        time.sleep(0.7)
        assert client.acquire(taken.key, 30) is not None
        assert lost_reason(client, expired) == "expired"
        assert lost_reason(client, taken) == "taken_over"

        released = client.acquire(f"{key}:released", 30)
        assert client.release(released)
        status = client.status(released.key, released.token)
        assert (status.state, status.reason, status.fence) == ("ended", "released", released.fence)

        # A token the server never saw: `unknown`; for a fast lease the client says `restarted`, as the
        # server cannot tell one lost in a crash from one it never granted.
        never = client.acquire(f"{key}:never", 30)
        client.release(never)
        for durable, reason in ((True, "unknown"), (False, "restarted")):
            ghost = type(never)(never.key, "", never.fence, uuid.uuid4(), never.acquired_at, never.expires_at, durable)
            assert lost_reason(client, ghost) == reason


async def test_async_renew_says_why_the_lease_was_lost(cluster, key):
    async with AsyncClient(cluster.conninfo) as client:
        lease = await client.acquire(key, 30)
        cluster.sql("SELECT fence.lease_revoke(%s)", (key,))
        with pytest.raises(LeaseLost) as lost:
            await client.renew(lease, 30)
        assert lost.value.reason == "revoked"
        assert (await client.status(key, lease.token)).reason == "revoked"
