//! Retries through `FenceClient`: after a reply lost with its connection, the retried acquire (same
//! token, chosen by the library before the first try) returns the lease that reply carried.
mod common;
use common::{cluster, config, plain, run};
use pg_fence_client::{lease, AcquireOptions, FenceClient};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use uuid::Uuid;

#[derive(Default)]
struct Proxy {
    /// Set: the next bytes the server sends are not passed on; both connections are closed instead.
    drop_next_reply: AtomicBool,
    connections: AtomicUsize,
    dropped_bytes: AtomicUsize,
}

async fn proxy(server_port: u16, proxy: Arc<Proxy>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            proxy.connections.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(forward(client, server_port, proxy.clone()));
        }
    });
    port
}

async fn forward(client: TcpStream, server_port: u16, proxy: Arc<Proxy>) {
    let server = TcpStream::connect(("127.0.0.1", server_port)).await.unwrap();
    let (mut from_client, mut to_server) = (client.into_split(), server.into_split());
    let upstream = tokio::spawn(async move { tokio::io::copy(&mut from_client.0, &mut to_server.1).await });
    let mut buffer = [0u8; 8192];
    while let Ok(n) = to_server.0.read(&mut buffer).await {
        if n == 0 {
            break;
        }
        if proxy.drop_next_reply.swap(false, Ordering::SeqCst) {
            proxy.dropped_bytes.fetch_add(n, Ordering::SeqCst);
            break;
        }
        if from_client.1.write_all(&buffer[..n]).await.is_err() {
            break;
        }
    }
    upstream.abort();
}

#[test]
fn a_retried_acquire_returns_the_lease_whose_reply_was_lost() {
    let cluster = cluster("rc_lost_reply", 27552);
    run(async {
        let state = Arc::new(Proxy::default());
        let port = proxy(cluster.port(), state.clone()).await;
        let client = FenceClient::new(config(port, "rc_proxied"));
        assert_eq!(client.current_fence("report").await.unwrap(), None, "connected through the proxy");

        // The acquire is one round trip (Parse/Bind/Execute/Sync), so its reply comes after its
        // commit: dropping it leaves a granted lease whose token only the client knows.
        state.drop_next_reply.store(true, Ordering::SeqCst);
        let opts = AcquireOptions::new(Duration::from_secs(3600));
        let lease = client.acquire("report", &opts).await.unwrap();
        assert!(state.dropped_bytes.load(Ordering::SeqCst) > 0, "no reply was dropped");
        assert_eq!(state.connections.load(Ordering::SeqCst), 2, "the retry reconnected");
        let lease = lease.expect("the retry returned the lease the lost reply granted, not None");

        let admin = plain(cluster.port()).await;
        assert_eq!(lease::current_fence(&admin, "report").await.unwrap(), Some(lease.fence));
        let grants: i64 = admin
            .query_one(
                "SELECT count(*) FROM fence.leases WHERE key = 'report' AND acquired_at = $1",
                &[&lease.acquired_at],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(grants, 1);
        // Anyone else (another token) finds the key held: the lost grant is the one returned.
        let other =
            lease::acquire(&admin, "report", &AcquireOptions::new(Duration::from_secs(5))).await.unwrap();
        assert_eq!(other, None);
        client.renew(&lease, Duration::from_secs(60)).await.unwrap();
        assert!(client.release(&lease).await.unwrap());
    });
}

#[test]
fn same_token_same_lease_and_reconnect_after_terminate() {
    let cluster = cluster("rc_same_token", 27553);
    run(async {
        let client = FenceClient::new(config(cluster.port(), "rc_retrying"));
        let opts = AcquireOptions::new(Duration::from_secs(60)).token(Uuid::new_v4());
        let first = client.acquire("job", &opts).await.unwrap().unwrap();
        let again = client.acquire("job", &opts).await.unwrap().unwrap();
        assert_eq!(again, first, "same fence, same acquired_at and expires_at");

        // The client's backend is terminated between calls: the next call reconnects by itself.
        let admin = plain(cluster.port()).await;
        let killed: bool = admin
            .query_one("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'rc_retrying'", &[])
            .await
            .unwrap()
            .get(0);
        assert!(killed);
        assert!(client.renew(&first, Duration::from_secs(60)).await.is_ok());
        assert!(client.release(&first).await.unwrap());
    });
}
