"""The plain calls and the sync Client, against a real server."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from datetime import timedelta

import psycopg
import pytest
from conftest import eventually

import pg_fence
from pg_fence import Client, LeaseLost, Retry, StaleFence, WaitCancelled, WaitTimedOut
from pg_fence.retry import Tries


def test_acquire_returns_the_lease_and_none_when_held(cluster, key):
    with Client(cluster.conninfo) as client:
        lease = client.acquire(key, 30, owner="worker-1")
        assert lease is not None and lease.key == key and lease.owner == "worker-1"
        assert isinstance(lease.token, uuid.UUID) and lease.fence == client.current_fence(key)
        assert lease.expires_at - lease.acquired_at == timedelta(seconds=30)
        # A refused acquire is None, not the row of NULLs that SELECT * FROM lease_acquire returns.
        assert client.acquire(key, timedelta(seconds=5)) is None
        assert client.release(lease) is True
        again = client.acquire(key, 0.5)
        assert again is not None and again.fence > lease.fence


def test_renew_and_release_with_a_lost_token(cluster, key):
    with Client(cluster.conninfo) as client:
        lease = client.acquire(key, 30)
        renewed = client.renew(lease, 60)
        assert renewed.fence == lease.fence and renewed.expires_at > lease.expires_at
        assert client.release(lease) and not client.release(lease)
        with pytest.raises(LeaseLost) as lost:
            client.renew(lease, 30)
        assert lost.value.key == key and lost.value.state == "lost"


def test_fenced_update_takes_dicts_and_refuses_a_stale_fence(cluster, key):
    with cluster.connect() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS py_jobs (id int PRIMARY KEY, status text, detail jsonb)")
        conn.execute("INSERT INTO py_jobs VALUES (1, 'new', NULL) ON CONFLICT (id) DO UPDATE SET status = 'new'")
        old = pg_fence.acquire(conn, key, 30)
        assert pg_fence.fenced_update(conn, key, old.fence, "py_jobs", {"status": "running"}, {"id": 1}) == 1
        conn.execute("SELECT fence.lease_revoke(%s)", (key,))
        new = pg_fence.acquire(conn, key, 30)
        with pytest.raises(StaleFence):
            pg_fence.fenced_update(conn, key, old.fence, "py_jobs", {"status": "stale"}, {"id": 1})
        assert pg_fence.fenced_update(conn, key, new.fence, "py_jobs", {"status": "done"}, {"id": 1}) == 1
        assert conn.execute("SELECT status FROM py_jobs WHERE id = 1").fetchone() == ("done",)
        with pytest.raises(StaleFence):
            with conn.transaction():
                pg_fence.fence_guard(conn, key, old.fence)


@pytest.mark.parametrize(
    "args, sqlstate",
    [
        (("", 30), "22023"),
        (("k", 0), "22023"),
        (("k", -1), "22023"),
        (("x" * 600, 30), "22023"),
    ],
)
def test_bad_input_is_the_servers_error_and_changes_nothing(cluster, args, sqlstate):
    with Client(cluster.conninfo) as client:
        with pytest.raises(psycopg.Error) as err:
            client.acquire(*args)
        assert err.value.sqlstate == sqlstate
        if args[0] and len(args[0]) < 512:
            assert client.current_fence(args[0]) is None


def test_seconds_must_be_numbers(cluster):
    with Client(cluster.conninfo) as client:
        with pytest.raises(TypeError):
            client.acquire("k", "30")


def test_a_cancelled_wait_is_wait_cancelled_not_a_broken_connection(cluster, key):
    with Client(cluster.conninfo) as holder, cluster.connect() as conn:
        assert holder.acquire(key, 30)
        conn.execute("SET statement_timeout = '200ms'")
        with pytest.raises(WaitCancelled):
            pg_fence.acquire(conn, key, 30, wait=10)
        assert not conn.broken


def test_lock_timeout_while_queued_behind_another_waiter_is_wait_cancelled(cluster, key):
    with Client(cluster.conninfo) as holder, cluster.connect() as first, cluster.connect() as second:
        assert holder.acquire(key, 30)
        ahead = threading.Thread(target=pg_fence.acquire, args=(first, key, 30), kwargs={"wait": 3})
        ahead.start()
        waiting = "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s"
        assert eventually(lambda: cluster.sql(waiting, (first.info.backend_pid,)) == ("Extension",))
        # Second in line, it queues for a lock behind the first, which its lock_timeout bounds.
        second.execute("SET lock_timeout = '200ms'")
        with pytest.raises(WaitCancelled) as cancelled:
            pg_fence.acquire(second, key, 30, wait=10)
        assert cancelled.value.sqlstate == "55P03" and not second.broken
        ahead.join()


def test_lease_raises_wait_timed_out_when_not_granted(cluster, key):
    with Client(cluster.conninfo) as client:
        assert client.acquire(key, 30)
        with pytest.raises(WaitTimedOut):
            client.lease(key, 30, wait=0.2)


def test_full_jitter_stays_within_its_bounds():
    retry = Retry(attempts=8, base=0.1, cap=1.0, total=None)
    for attempt in range(8):
        bound = min(1.0, 0.1 * 2**attempt)
        pauses = [retry.pause(attempt) for _ in range(200)]
        assert all(0 <= p <= bound for p in pauses) and max(pauses) > bound / 2
    assert len(list(retry.pauses())) == 7
    assert list(Retry(attempts=1).pauses()) == []


def test_the_default_retry_is_bounded_by_its_total_time_not_a_count():
    # Tries at once take no time: only the 15 s total would end them.
    assert len(list(itertools.islice(Retry().pauses(), 100))) == 100
    assert list(Retry(total=0.0).pauses()) == []


def test_the_total_counts_from_the_first_failure_not_from_the_call():
    # A call that ran longer than the total before it failed (an acquire waiting on the server)
    # still gets its retries.
    tries = Tries(Retry(total=0.5))
    time.sleep(0.6)
    assert 0 <= tries.pause_or_raise(OSError("connection broken")) <= Retry().base
