"""An acquire whose reply is lost after the grant committed: the Client's retry carries the same
token, so it gets the lease that reply granted instead of finding the key held for the whole TTL."""

from __future__ import annotations

from proxy import Proxy

from pg_fence import Client, Retry


def test_a_retried_acquire_after_a_lost_reply_gets_the_granted_lease(cluster, key):
    proxy = Proxy(cluster.port)
    conninfo = f"host=127.0.0.1 port={proxy.port} user=postgres dbname=postgres"
    with Client(conninfo, retry=Retry(attempts=3, base=0.01)) as client:
        client.current_fence("warm-up")  # the connection exists before the reply is dropped
        proxy.drop_reply_after = b"lease_acquire"
        lease = client.acquire(key, 30)
        assert proxy.dropped == 1, "the proxy lost the first reply"
        assert lease is not None, "the retry found the key held: it did not reuse the token"
        row = cluster.sql("SELECT fence, live FROM fence.leases WHERE key = %s", (key,))
        assert row == (lease.fence, True)
        assert client.renew(lease, 30).fence == lease.fence
        assert client.release(lease) is True
    proxy.close()
