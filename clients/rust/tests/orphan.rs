//! Session-bound leases and orphaned backends: a connection broken on the client's side only (a
//! partition, a timeout) leaves its backend alive until the server notices. The server hands the
//! lease a token holds to whichever session asks, so a retry with the same token, or a renewal from
//! another connection, would keep a lease that ends whenever that orphan does.
mod common;
use common::proxy::{Cut, Proxy};
use common::{backends, cluster, config, eventually, plain, run, server_lease, session_pid};
use pg_fence_client::{hold, lease, AcquireOptions, HeldLease, KeepOptions, LeaseState, LossReason};
use std::time::Duration;
use tokio_postgres::Client;
use uuid::Uuid;

fn bound(ttl_secs: u64) -> AcquireOptions {
    AcquireOptions::new(Duration::from_secs(ttl_secs)).session_bound(true)
}

async fn hold_bound(port: u16, name: &str, opts: AcquireOptions) -> HeldLease {
    hold(config(port, name), "leader", &opts, KeepOptions::default()).await.unwrap()
}

/// Nobody else can take `key` now.
async fn taken(admin: &Client, key: &str) -> bool {
    lease::acquire(admin, key, &AcquireOptions::new(Duration::from_secs(5))).await.unwrap().is_none()
}

#[test]
fn a_retried_session_bound_acquire_is_bound_to_the_keepers_session_not_the_orphan() {
    let cluster = cluster("rc_orphan_acquire", 27563);
    run(async {
        let admin = plain(cluster.port()).await;
        let proxy = Proxy::start(cluster.port()).await;
        proxy.drop_reply_to("lease_acquire", Cut::ClientSide);
        let held = hold_bound(proxy.port, "rc_orphaned", bound(30)).await;
        assert!(proxy.dropped_bytes() > 0, "no reply was dropped");
        assert_eq!(backends(&admin, "rc_orphaned").await.len(), 2, "the first try's backend lives on");

        proxy.end_orphans();
        let one_left = || async { backends(&admin, "rc_orphaned").await.len() == 1 };
        assert!(eventually(Duration::from_secs(10), one_left).await, "the orphan ended");
        let keeper = backends(&admin, "rc_orphaned").await[0];
        assert_eq!(session_pid(&admin, "leader").await, Some(keeper), "bound to the keeper's session");
        assert_eq!(server_lease(&admin, "leader").await, Some((true, held.fence())), "outlived the orphan");
        assert!(held.is_held());
        assert!(taken(&admin, "leader").await);
        assert!(held.release().await.unwrap());
    });
}

#[test]
fn a_token_that_is_another_sessions_lease_is_not_taken_as_the_keepers() {
    let cluster = cluster("rc_token_twice", 27564);
    run(async {
        let (admin, other) = (plain(cluster.port()).await, plain(cluster.port()).await);
        let token = Uuid::new_v4();
        let first = lease::acquire(&other, "leader", &bound(30).token(token)).await.unwrap().unwrap();
        let held = hold_bound(cluster.port(), "rc_twice", bound(30).token(token)).await;
        assert_ne!(held.lease().token, token, "a fresh token");
        assert!(held.fence() > first.fence);
        let keeper = backends(&admin, "rc_twice").await;
        assert_eq!(session_pid(&admin, "leader").await.map(|pid| vec![pid]), Some(keeper));
        assert!(held.release().await.unwrap());
    });
}

#[test]
fn a_session_bound_lease_whose_connection_broke_on_this_side_only_is_lost_and_released() {
    let cluster = cluster("rc_orphan_renew", 27565);
    run(async {
        let admin = plain(cluster.port()).await;
        let proxy = Proxy::start(cluster.port()).await;
        let held = hold_bound(proxy.port, "rc_severed", bound(3)).await;
        let orphan = session_pid(&admin, "leader").await.unwrap();

        proxy.sever();
        // Told at once (the connection closed), not at the next renewal, 1 s away, nor ever: a
        // renewal on a new connection would succeed, for a lease bound to the orphan.
        let told = tokio::time::timeout(Duration::from_millis(900), held.lost()).await;
        assert_eq!(told, Ok(LeaseState::Lost(LossReason::SessionEnded)));
        // Released by its token on a new connection, though the orphan still holds the session lock.
        let released = || async { server_lease(&admin, "leader").await.is_some_and(|(live, _)| !live) };
        assert!(eventually(Duration::from_secs(5), released).await, "released while the orphan lives");
        assert!(backends(&admin, "rc_severed").await.contains(&orphan), "the orphan lived on");
        assert!(!taken(&admin, "leader").await, "free for the next holder");
        proxy.end_orphans();
        assert!(!held.release().await.unwrap());
    });
}
