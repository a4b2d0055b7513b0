//! Why a lease was lost, as the client tells it: each reason produced for real (a revoke, an expiry,
//! a takeover, a crash of the server under a fast lease, a server unreachable past the deadline) and
//! told by `FenceClient::renew` (`Error::LeaseLost`'s reason), the held lease (`LeaseState::Lost`,
//! `on_lost`) and `lease::status`.
mod common;
use common::{cluster, config, eventually, recording_losses, run, Frozen};
use pg_fence_client::{hold, lease, AcquireOptions, Error, FenceClient, Lease, LeaseState, LossReason};
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

#[test]
fn a_held_fast_lease_lost_in_a_crash_is_restarted() {
    let cluster = cluster("rc_restarted", 27591);
    run(async {
        let (keep, told) = recording_losses(Duration::from_secs(1));
        let fast = AcquireOptions::new(Duration::from_secs(8)).durable(false);
        let held = hold(config(cluster.port(), "rc_keeper"), "cache", &fast, keep).await.unwrap();
        tokio::task::block_in_place(|| {
            cluster.crash();
            cluster.restart();
        });
        let lost = tokio::time::timeout(Duration::from_secs(10), held.lost()).await;
        assert_eq!(lost, Ok(LeaseState::Lost(LossReason::Restarted)));
        // on_lost is called just after the state moves, from the keeper's task.
        let heard = eventually(Duration::from_secs(2), || async { !told.lock().unwrap().is_empty() }).await;
        assert!(heard, "on_lost was never called");
        assert_eq!(*told.lock().unwrap(), [LeaseState::Lost(LossReason::Restarted)]);
    });
}

#[test]
fn a_lease_unreachable_at_its_deadline_learns_at_its_release_that_it_was_taken_over() {
    let cluster = cluster("rc_unreachable_reason", 27592);
    run(async {
        let (keep, told) = recording_losses(Duration::from_millis(500));
        let opts = AcquireOptions::new(Duration::from_secs(2));
        let held = hold(config(cluster.port(), "rc_keeper"), "leader", &opts, keep).await.unwrap();
        let frozen = Frozen::server(&cluster);
        let lost = tokio::time::timeout(Duration::from_secs(10), held.lost()).await;
        assert_eq!(lost, Ok(LeaseState::Unknown));
        assert_eq!(held.state().reason(), Some(LossReason::Unreachable));
        tokio::time::sleep(Duration::from_millis(2500)).await; // past the server's expiry too
        drop(frozen);
        let client = FenceClient::new(config(cluster.port(), "rc_taker"));
        let waiting = AcquireOptions::new(Duration::from_secs(30)).wait(Duration::from_secs(5));
        let taker = client.acquire("leader", &waiting).await.unwrap().expect("granted once it expired");
        assert!(taker.fence > held.fence());
        let watch = held.watch();
        assert!(!held.release().await.unwrap());
        assert_eq!(
            *watch.borrow(),
            LeaseState::Lost(LossReason::TakenOver),
            "the release asked what became of it"
        );
        assert_eq!(*told.lock().unwrap(), [LeaseState::Unknown], "on_lost was told once, at the deadline");
    });
}
