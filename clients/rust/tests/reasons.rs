//! Why a lease was lost, as `FenceClient::renew` tells it (`Error::LeaseLost`'s reason) and
//! `lease::status` says it: a revoke, an expiry, a takeover, a token the server never saw. The held
//! lease tells its reasons in keeper.json's scenarios (`tests/keeper_behaviours.rs`).
mod common;
use common::{cluster, config, run};
use pg_fence_client::{lease, AcquireOptions, Error, FenceClient, Lease, LossReason};
use std::time::Duration;
use uuid::Uuid;

async fn lost_reason<C: pg_fence_client::Connector>(client: &FenceClient<C>, lease: &Lease) -> LossReason {
    match client.renew(lease, Duration::from_secs(30)).await {
        Err(Error::LeaseLost { reason: Some(reason), .. }) => reason,
        other => panic!("{other:?}"),
    }
}

#[test]
fn renew_says_why_the_lease_was_lost() {
    let cluster = cluster("rc_reasons", 27590);
    run(async {
        let client = FenceClient::new(config(cluster.port(), "rc_reasons"));
        let ttl = AcquireOptions::new(Duration::from_secs(30));
        let short = AcquireOptions::new(Duration::from_millis(500));
        let revoked = client.acquire("revoked", &ttl).await.unwrap().unwrap();
        assert!(client.status("revoked", revoked.token).await.unwrap().is_live());
        client
            .connection()
            .await
            .unwrap()
            .execute("SELECT fence.lease_revoke('revoked')", &[])
            .await
            .unwrap();
        assert_eq!(lost_reason(&client, &revoked).await, LossReason::Revoked);

        let expired = client.acquire("expired", &short).await.unwrap().unwrap();
        let taken = client.acquire("taken", &short).await.unwrap().unwrap();
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(client.acquire("taken", &ttl).await.unwrap().is_some());
        assert_eq!(lost_reason(&client, &expired).await, LossReason::Expired);
        assert_eq!(lost_reason(&client, &taken).await, LossReason::TakenOver);

        let released = client.acquire("released", &ttl).await.unwrap().unwrap();
        assert!(client.release(&released).await.unwrap());
        let status = client.status("released", released.token).await.unwrap();
        assert_eq!(
            (status.state.as_str(), status.reason.as_deref(), status.fence),
            ("ended", Some("released"), Some(released.fence))
        );

        // A token the server never saw is `unknown`; for a fast lease the client says `Restarted`, as
        // the server cannot tell one lost in a crash from one it never granted.
        for (durable, reason) in [(true, LossReason::Unknown), (false, LossReason::Restarted)] {
            let ghost = Lease { token: Uuid::new_v4(), durable, ..released.clone() };
            assert_eq!(lost_reason(&client, &ghost).await, reason);
        }
        // The one-statement call does not ask.
        let err = lease::renew(&**client.connection().await.unwrap(), &revoked, Duration::from_secs(1)).await;
        assert!(matches!(err, Err(Error::LeaseLost { reason: None, .. })), "{err:?}");
    });
}
