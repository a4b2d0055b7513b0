"""The elector beyond the shared behaviours (test_behaviours.py): on_new_leader, a campaign's own
wait, an interrupted campaign, release_on_cancel=False, and calls of a leadership that has ended."""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import pytest
from conftest import backend_gone, eventually, interrupted_with_its_backend_stopped, waiters

from pg_fence import Client, LeaseLost, WaitTimedOut
from pg_fence.aio import AsyncClient
from pg_fence.election import Leader


def assert_granted_nothing(cluster, key, leadership, interrupted) -> None:
    """The campaign of elector `interrupted` waits no more, and `leadership` resigned, the key is
    not granted to it."""
    assert eventually(lambda: waiters(cluster, key) == 0, 5), "the interrupted campaign still waits"
    assert leadership.resign()
    time.sleep(0.3)
    assert interrupted.leader() is None, "the interrupted campaign was granted the key"


def test_on_new_leader_is_told_every_change(cluster, key):
    told: list = []
    with Client(cluster.conninfo) as client:
        with client.elector(key, 5, on_new_leader=told.append) as elector:
            assert eventually(lambda: told == [None], 5), "the present first, the vacancy"
            with elector.campaign("v1") as leadership:
                assert eventually(lambda: told == [None, Leader(leadership.fence, "v1")], 5), told
                leadership.proclaim("v2")
                assert leadership.value == "v2"
                assert eventually(lambda: told[-1:] == [Leader(leadership.fence, "v2")], 5), told
            assert eventually(lambda: told[-1:] == [None], 5), told
            assert len(told) == 4


async def test_async_on_new_leader_is_told_every_change(cluster, key):
    told: list = []
    async with AsyncClient(cluster.conninfo) as client:
        async with client.elector(key, 5, on_new_leader=told.append) as elector:
            for _ in range(500):
                if told:
                    break
                await asyncio.sleep(0.01)
            assert told == [None], "the present first, the vacancy"
            async with await elector.campaign("v1") as leadership:
                for _ in range(500):
                    if len(told) == 2:
                        break
                    await asyncio.sleep(0.01)
                assert told == [None, Leader(leadership.fence, "v1")]
            for _ in range(500):
                if len(told) == 3:
                    break
                await asyncio.sleep(0.01)
            assert told == [None, Leader(leadership.fence, "v1"), None]


def test_a_campaign_waits_as_long_as_asked(cluster, key):
    with Client(cluster.conninfo) as client:
        with client.elector(key, 5) as elector, client.elector(key, 5) as other:
            with elector.campaign("a"):
                started = time.monotonic()
                with pytest.raises(WaitTimedOut):
                    other.campaign("b", wait=0.5)
                assert 0.5 <= time.monotonic() - started < 5
                assert waiters(cluster, key) == 0


def test_an_interrupted_campaign_leaves_the_queue_granted_nothing(cluster, key):
    # A KeyboardInterrupt while the campaign waits on the server: its wait is cancelled there, so
    # the key is not granted to it when the leader resigns.
    def interrupt(*_):
        raise KeyboardInterrupt

    with Client(cluster.conninfo) as client:
        leader_elector, elector = client.elector(key, 5), client.elector(key, 5)
        leadership = leader_elector.campaign("a")
        previous = signal.signal(signal.SIGALRM, interrupt)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.5)
            with pytest.raises(KeyboardInterrupt):
                elector.campaign("b")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        assert_granted_nothing(cluster, key, leadership, elector)
        leader_elector.close()
        elector.close()


def test_an_interrupted_campaign_closes_no_connection_under_the_call_still_running_on_it(
    cluster, key, closed_mid_statement
):
    # The campaign's statement outlives the interrupt: its backend is stopped, so the cancel cannot
    # end it yet. Its connection must be left to the thread running it. Closed under that thread,
    # its socket became the next connection's, whose replies the old call then read: the next
    # connect or query of the process waited for ever.
    with Client(cluster.conninfo) as client, Client(cluster.conninfo, application_name="interrupted_campaign") as other:
        leader_elector, elector = client.elector(key, 10), other.elector(key, 5)
        leadership = leader_elector.campaign("a")
        ready = lambda: waiters(cluster, key) == 1  # noqa: E731
        with interrupted_with_its_backend_stopped(cluster, "interrupted_campaign", ready) as stopped:
            elector.campaign("b")
        assert stopped, "the campaign never waited"
        assert closed_mid_statement == [], f"closed with its statement in flight, by {closed_mid_statement}"
        assert eventually(backend_gone(cluster, stopped[0]), 10), "the abandoned connection was never closed"
        assert_granted_nothing(cluster, key, leadership, elector)
        leader_elector.close()
        elector.close()


def test_without_release_on_cancel_a_cancelled_leadership_is_left_to_expire(cluster, key):
    stopped: list = []
    with Client(cluster.conninfo) as client:
        elector = client.elector(key, 1.5, release_on_cancel=False, on_stopped_leading=stopped.append)
        leadership = elector.campaign("a")
        elector.close()  # the cancel
        assert stopped == ["cancelled"] and leadership.lost.is_set() and not leadership.held()
        assert elector.leader() == Leader(leadership.fence, "a"), "released, though asked not to"
        assert eventually(lambda: elector.leader() is None, 5), "renewed after the cancel"
        status = client.status(key, leadership.token)
        assert (status.state, status.reason) == ("ended", "expired")


def test_an_ended_leadership_cannot_proclaim_or_hand_off(cluster, key):
    with Client(cluster.conninfo) as client:
        with client.elector(key, 30) as elector:
            leadership = elector.campaign("a")
            cluster.sql("SELECT fence.lease_revoke(%s)", (key,))
            with pytest.raises(LeaseLost) as lost:
                leadership.proclaim("b")  # the keeper has heard nothing yet: the server says so
            assert (lost.value.reason, leadership.reason, leadership.stopped_reason) == ("revoked",) * 3
            with pytest.raises(LeaseLost):
                leadership.handoff("b")
            assert elector.leader() is None


def test_options_are_checked_before_anything_is_sent():
    with Client("host=127.0.0.1 port=27549 user=postgres dbname=postgres") as client:
        with pytest.raises(ValueError):
            client.elector("k", 1, renew_every=2)
        with pytest.raises(TypeError):
            client.elector("k", 1, lock_delay="2s")


def test_an_elector_closed_during_a_campaign_ends_it(cluster, key):
    with Client(cluster.conninfo) as client:
        with client.elector(key, 5) as holder:
            leadership = holder.campaign("a")
            elector = client.elector(key, 5)
            failed: list = []
            thread = threading.Thread(target=lambda: failed.append(pytest.raises(Exception, elector.campaign, "b")))
            thread.start()
            assert eventually(lambda: waiters(cluster, key) == 1, 5)
            elector.close()
            thread.join(5)
            assert not thread.is_alive() and type(failed[0].value).__name__ == "WaitCancelled"
            assert waiters(cluster, key) == 0
            leadership.resign()
