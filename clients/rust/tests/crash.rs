//! kill -9 of the server under a held lease: the keeper reconnects and, the lease being durable and
//! the restart quicker than its TTL, renews it on the restarted server.
mod common;
use common::{cluster, eventually, held_and_renewed, plain, run, server_lease};
use pg_fence_client::LeaseState;
use std::time::{Duration, SystemTime};

#[test]
fn a_durable_lease_is_renewed_after_a_crash_and_restart() {
    let cluster = cluster("rc_crash", 27558);
    run(async {
        let ttl = Duration::from_secs(6);
        let held = held_and_renewed(cluster.port(), "nightly", ttl).await;
        let mut changes = held.watch();

        tokio::task::block_in_place(|| {
            cluster.crash();
            cluster.restart();
        });
        let restarted_at = SystemTime::now();
        // A renewal the restarted server made: its expiry is past restart + ttl.
        let renewed = tokio::time::timeout(ttl + Duration::from_secs(10), async {
            loop {
                changes.changed().await.unwrap();
                match *changes.borrow() {
                    LeaseState::Held { expires_at, .. } if expires_at >= restarted_at + ttl => return Ok(()),
                    LeaseState::Held { .. } => {}
                    ended => return Err(ended),
                }
            }
        })
        .await;
        assert_eq!(renewed, Ok(Ok(())), "renewed after the restart");
        assert!(held.is_held());
        let admin = plain(cluster.port()).await;
        assert_eq!(
            server_lease(&admin, "nightly").await,
            Some((true, held.fence())),
            "the grant survived the crash"
        );
        let fence = held.fence();
        assert!(held.release().await.unwrap());
        let released = eventually(Duration::from_secs(5), || async {
            server_lease(&admin, "nightly").await == Some((false, fence))
        });
        assert!(released.await);
    });
}
