"""What an adversarial review found: pools without autocommit, a grant that came after a long
wait, a session-bound grant left behind in a session cut off from us, a standby reached after a
failover, a stopped server under a plain call, input that never reached the server."""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from conftest import backend_gone, eventually, interrupted_with_its_backend_stopped, waiters
from proxy import Proxy
from psycopg_pool import ConnectionPool

import pg_fence
from pg_fence import Client, OutcomeUnknown, Retry
from pg_fence.connections import Lanes, bounded
from pg_fence.errors import CallTimedOut


def live(cluster, key):
    return cluster.sql("SELECT fence, session_pid FROM fence.leases WHERE key = %s AND live", (key,))


def test_a_pool_without_autocommit_renews_commits_and_gets_its_connections_back_unchanged(cluster, key):
    with ConnectionPool(cluster.conninfo, min_size=2, max_size=2, open=True) as pool:
        with Client(pool=pool) as client, client.lease(key, 1.0) as lease:
            first = live(cluster, key)
            time.sleep(2.5)
            assert lease.held() and live(cluster, key)[0] == lease.fence == first[0]
        assert live(cluster, key) is None, "the release was committed"
        assert eventually(lambda: pool.get_stats().get("pool_available") == 2), "a connection was not given back"
        for _ in range(2):
            with pool.connection() as conn:
                assert conn.execute("SHOW statement_timeout").fetchone() == ("0",)
                assert conn.autocommit is False


def test_a_grant_after_a_wait_longer_than_the_ttl_is_held(cluster, key):
    with Client(cluster.conninfo) as client:
        assert client.acquire(key, 1.5)
        started = time.monotonic()
        with client.lease(key, 1.0, wait=5) as lease:
            assert time.monotonic() - started > 1.0
            assert lease.state == "held"
            time.sleep(1.5)
            assert lease.held() and live(cluster, key)[0] == lease.fence


def test_a_session_bound_grant_in_a_session_cut_off_from_us_is_not_kept(cluster, key):
    proxy = Proxy(cluster.port)
    conninfo = f"host=127.0.0.1 port={proxy.port} user=postgres dbname=postgres"
    with Client(conninfo, application_name="cut_off", retry=Retry(attempts=3, base=0.01)) as client:
        proxy.drop_reply_after, proxy.orphan = b"lease_acquire", True
        with client.lease(key, 30, session_bound=True) as lease:
            assert proxy.dropped == 1, "the first grant's reply was lost"
            proxy.close_orphans()
            # The session of the first try ends; the lease must not have been that session's.
            assert eventually(lambda: len(cluster.backend_pids("cut_off")) == 1)
            assert live(cluster, key) == (lease.fence, cluster.backend_pids("cut_off")[0])
            assert lease.held()
    proxy.close()


def test_a_standby_reached_is_left_for_a_new_connection(cluster, key):
    with Client(cluster.conninfo, retry=Retry(attempts=3, base=0.01)) as client:
        client.current_fence(key)
        # As a connection to a server that became a standby: every change raises 25006.
        client._connections.current().execute("SET default_transaction_read_only = on")
        assert client.acquire(key, 30) is not None


def test_input_that_never_reached_the_server_is_not_an_unknown_outcome(cluster):
    with Client(cluster.conninfo) as client:
        with pytest.raises(psycopg.DataError):
            client.acquire("nul\x00byte", 30)


@pytest.mark.port(27513)
def test_a_plain_call_on_a_stopped_server_ends_in_time_with_its_token(own_cluster, key):
    client = Client(own_cluster.conninfo, call_timeout=1, connect_timeout=1, retry=Retry(attempts=2, base=0.01))
    client.current_fence(key)
    own_cluster.signal_server(signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(OutcomeUnknown) as unknown:
            client.acquire(key, 30, token=None)
        print(f"\nstopped server: OutcomeUnknown after {time.monotonic() - started:.1f} s")
        assert time.monotonic() - started < 10
    finally:
        own_cluster.signal_server(signal.SIGCONT)
    client.close()
    assert unknown.value is not None


@pytest.mark.port(27514)
def test_the_default_retry_outlives_a_restart_of_several_seconds(own_cluster, key):
    with Client(own_cluster.conninfo) as client:
        assert client.current_fence(key) is None
        own_cluster.run("stop", own_cluster.name)
        restart = threading.Timer(3.0, own_cluster.start)
        restart.start()
        try:
            # A call on the kept connection, which the server ended, and a kept lease's acquire,
            # on a new one: both refused until the server is back.
            with ThreadPoolExecutor(2) as calls:
                acquired = calls.submit(client.acquire, key, 30)
                kept = calls.submit(client.lease, f"{key}:kept", 30)
                assert acquired.result() is not None
                assert kept.result().release()
        finally:
            restart.join()


def test_a_refused_connection_is_not_an_unknown_outcome(key):
    nowhere = "host=127.0.0.1 port=27549 user=postgres dbname=postgres"  # nothing listens there
    with Client(nowhere, retry=Retry(total=0.5)) as client:
        for call in (lambda: client.acquire(key, 30), lambda: client.lease(key, 30)):
            with pytest.raises(Exception) as failed:
                call()
            assert not isinstance(failed.value, OutcomeUnknown), "nothing reached the server"
            assert isinstance(failed.value, pg_fence.ConnectFailed)


def test_a_call_given_no_time_answers_or_times_out_and_gives_its_connection_back(cluster):
    # With no time left, the call's thread has mostly not started it when the limit passes: it is
    # then never run, and is CallTimedOut like a call that ran too long, never an answer of None.
    lanes = Lanes(cluster.conninfo, 60)
    select = lambda conn: conn.execute("SELECT 1").fetchone()[0]  # noqa: E731
    try:
        answers = []
        for _ in range(50):
            try:
                answers.append(bounded(lanes, select, 0))
            except CallTimedOut:
                answers.append("timed out")
        assert set(answers) <= {1, "timed out"}, answers
        # Each call gave its connection slot back, also one withdrawn or abandoned.
        taken = [lanes._slots.acquire(timeout=10) for _ in range(60)]
        assert all(taken), f"{taken.count(False)} of the 60 slots never came back"
    finally:
        lanes.shut()


def test_a_lease_interrupted_while_it_waits_on_the_clients_one_connection_is_cancelled_not_closed_under(
    cluster, key, closed_mid_statement
):
    # Ctrl-C in `client.lease(..., wait=...)`, whose acquire waits on the client's one connection,
    # then the `with Client` block closes the client. The acquire's statement is cancelled (it is
    # the connection's own: calls on it take turns), and its connection is closed by the thread
    # running it once the statement has ended, not by close() under it.
    with Client(cluster.conninfo) as holder:
        held = holder.acquire(key, 30)
        ready = lambda: waiters(cluster, key) == 1  # noqa: E731
        with interrupted_with_its_backend_stopped(cluster, "interrupted_lease", ready) as stopped:
            with Client(cluster.conninfo, application_name="interrupted_lease") as client:
                client.lease(key, 10, wait=30)
        assert stopped, "the acquire never waited"
        assert closed_mid_statement == [], f"closed with its statement in flight, by {closed_mid_statement}"
        assert eventually(backend_gone(cluster, stopped[0]), 10), "the abandoned connection was never closed"
        assert eventually(lambda: waiters(cluster, key) == 0, 5), "still waiting"
        assert holder.release(held)
        time.sleep(0.3)
        assert live(cluster, key) is None, "the interrupted acquire was granted the key"
