"""Kept leases under faults, beyond the scenarios of keeper.json (test_keeper_behaviours.py): what
a takeover leaves the holder's calls, a deadline that comes before the server's expiry, renewals
after kill -9 of the server, releases. Each prints the time from the loss to the client being told."""

from __future__ import annotations

import signal
import time
from datetime import datetime, timezone

import pytest
from conftest import eventually

import pg_fence
from pg_fence import Client, LeaseLost, StaleFence
from pg_fence.connections import Lanes
from pg_fence.holding import clock


def wall(at: float) -> datetime:
    """`at` on pg_fence's clock, on the wall clock."""
    return datetime.fromtimestamp(time.time() - (clock() - at), timezone.utc)


def live_fence(cluster, key):
    row = cluster.sql("SELECT fence FROM fence.leases WHERE key = %s AND live", (key,))
    return row[0] if row else None


def test_a_takeover_is_told_within_a_renewal(cluster, key):
    told = []
    with Client(cluster.conninfo) as client:
        with client.lease(key, 1.5, on_lost=lambda kept: told.append((kept.state, kept.reason))) as lease:
            revoked = clock()
            cluster.sql("SELECT fence.lease_revoke(%s)", (key,))
            taker = client.acquire(key, 30)
            assert lease.lost.wait(5), "the keeper never noticed the takeover"
            print(f"\ntakeover: told {1000 * (lease.lost_at - revoked):.0f} ms after the revoke")
            assert lease.state == "lost" and lease.reason == "revoked"
            assert eventually(lambda: told == [("lost", "revoked")], 5), "on_lost was called once, after lost was set"
            with pytest.raises(LeaseLost) as lost:
                lease.check()
            assert (lost.value.state, lost.value.reason) == ("lost", "revoked")
            with cluster.connect() as conn:
                with pytest.raises(LeaseLost):
                    lease.fenced_update(conn, "pg_class", {"relname": "x"}, {"oid": 0})
                with pytest.raises(StaleFence):  # and the server refuses the old fence too
                    pg_fence.fenced_update(conn, key, lease.fence, "pg_class", {"relname": "x"}, {"oid": 0})
        # Leaving the block never releases the new holder's lease.
        assert live_fence(cluster, key) == taker.fence


def test_lost_is_set_for_whoever_acts_on_an_end_another_thread_declared(cluster, key):
    with Client(cluster.conninfo) as client:
        with client.lease(key, 30) as lease:
            # The watchdog's first step, as when it is preempted before it sets `lost`.
            assert lease._holding.declare("unknown")
            with pytest.raises(LeaseLost):
                lease.check()
            assert lease.lost.is_set(), "check() raised LeaseLost while lost was still clear"


@pytest.mark.port(27510)
def test_a_stopped_server_is_declared_unknown_before_the_lease_expires(own_cluster, key):
    client = Client(own_cluster.conninfo)
    # No renewal before the stop (the first is due in 1.5 s), so the expiry read now is the last.
    lease = client.lease(key, 2.0, renew_every=1.5)
    expiry = own_cluster.sql("SELECT expires_at FROM fence.leases WHERE key = %s", (key,))[0]
    own_cluster.signal_server(signal.SIGSTOP)
    try:
        assert lease.lost.wait(10), "never declared lost while renewals could not get through"
        assert lease.state == "unknown" and lease.reason == "unreachable" and not lease.held()
    finally:
        own_cluster.signal_server(signal.SIGCONT)
    # On the wall clock, which the server (on this machine) shares: the deadline that held() obeys
    # comes before the server's expiry; telling it takes a thread's wake-up more.
    deadline, told = wall(lease.deadline), wall(lease.lost_at)
    print(
        f"\nstopped server: deadline {1000 * (expiry - deadline).total_seconds():.0f} ms and told"
        f" {1000 * (expiry - told).total_seconds():.0f} ms before the server's expiry"
    )
    assert deadline < expiry, "held() would have said held after the server's expiry"
    assert lease.lost_at - lease.deadline < 1.0
    lease.release()  # an unknown lease may be live: released, or renewed late and then released
    assert eventually(lambda: live_fence(own_cluster, key) is None)
    client.close()


def test_a_closed_keeper_leaves_a_connection_in_use_to_the_call_using_it(cluster):
    # Freed from another thread, libpq's connection is used after free by the call still waiting
    # on it (a segfault, once the next connection reused its memory and socket).
    lanes = Lanes(cluster.conninfo, 2)
    busy, idle = lanes.checkout(), lanes.checkout()
    lanes.checkin(idle)
    lanes.shut()
    assert idle.closed, "an idle connection outlived the keeper"
    assert not busy.closed, "the keeper closed a connection a call was using"
    assert busy.execute("SELECT 1").fetchone() == (1,)
    lanes.checkin(busy)
    assert busy.closed, "a connection handed back to a closed keeper was kept"


@pytest.mark.port(27511)
def test_a_durable_lease_survives_kill_9_of_the_server(own_cluster, key):
    # A TTL the crash and restart fit in on a busy machine (they took over 6 s): a lease whose
    # local deadline passes while the server is down is rightly told lost (unreachable).
    with Client(own_cluster.conninfo) as client:
        with client.lease(key, 20.0) as lease:
            own_cluster.crash()
            own_cluster.start()
            before = own_cluster.sql("SELECT expires_at FROM fence.leases WHERE key = %s", (key,))[0]
            assert eventually(
                lambda: own_cluster.sql("SELECT expires_at FROM fence.leases WHERE key = %s", (key,))[0] > before, 30
            ), f"the keeper never renewed after the restart ({lease.reason})"
            assert lease.held() and live_fence(own_cluster, key) == lease.fence


def test_release_on_exit_of_a_failing_block(cluster, key):
    with Client(cluster.conninfo) as client:
        with pytest.raises(RuntimeError):
            with client.lease(key, 30):
                raise RuntimeError("work failed")
        assert live_fence(cluster, key) is None


def test_renewals_run_in_the_background_while_the_work_computes(cluster, key):
    with Client(cluster.conninfo) as client:
        with client.lease(key, 0.9) as lease:
            end = time.monotonic() + 2.5
            while time.monotonic() < end:  # pure Python that never sleeps: the GIL is shared
                pass
            assert lease.held()


def test_a_release_whose_connection_broke_is_retried_on_a_new_one(cluster, key):
    with Client(cluster.conninfo, application_name="broken_release") as client:
        lease = client.lease(key, 30)  # the next renewal is 10 s away: nobody has noticed by then
        (pid,) = cluster.backend_pids("broken_release")
        cluster.sql("SELECT pg_terminate_backend(%s)", (pid,))
        assert eventually(lambda: not cluster.backend_pids("broken_release"))
        assert lease.release() is True, "the release was not tried again on a new connection"
        assert lease.state == "released" and live_fence(cluster, key) is None


def test_a_release_that_finds_the_lease_gone_says_lost_not_released(cluster, key):
    with Client(cluster.conninfo) as client:
        lease = client.lease(key, 30)
        cluster.sql("SELECT fence.lease_revoke(%s)", (key,))
        assert lease.release() is False
        assert lease.state == "lost" and lease.lost.is_set()
        assert lease.reason == "revoked", "the release asked the server why it found nothing"


def test_keeper_connections_must_be_a_positive_int():
    for wrong in (0, -1, 1.5, True):
        with pytest.raises(ValueError):
            Client("", keeper_connections=wrong)


def test_a_revoked_lease_among_many_is_told_alone(cluster, key):
    """lease_renew_many answers each lease on its own: the revoked one is lost with its reason,
    the others renewed in the same calls stay held."""
    with Client(cluster.conninfo, keeper_connections=1) as client:
        leases = [client.lease(f"{key}-{n}", 1.5) for n in range(10)]
        cluster.sql("SELECT fence.lease_revoke(%s)", (f"{key}-3",))
        assert leases[3].lost.wait(5), "the revoked lease was not told"
        assert leases[3].state == "lost" and leases[3].reason == "revoked"
        time.sleep(2)
        assert [lease.state for n, lease in enumerate(leases) if n != 3] == ["held"] * 9
        assert client.keeper().lanes.made == 1
        for lease in leases:
            lease.release()


def test_the_first_free_key_as_a_plain_call(cluster, key):
    keys = [f"{key}-{n}" for n in range(3)]
    with Client(cluster.conninfo) as client:
        first = client.acquire_first_free(keys, 30)
        second = client.acquire_first_free(keys, 30)
        assert (first.key, second.key) == (keys[0], keys[1])
        assert client.acquire_first_free(keys[:2], 30) is None
        for lease in (first, second):
            assert client.release(lease)
