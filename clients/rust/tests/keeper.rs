//! `hold`: renewals, and the three ways a held lease ends (takeover, unreachable server, release).
mod common;
use common::{cluster, config, eventually, held_and_renewed, plain, run, server_lease, Frozen};
use pg_fence_client::{hold, lease, AcquireOptions, Error, KeepOptions, LeaseState, LossReason};
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

const TTL: Duration = Duration::from_millis(1500);

#[test]
fn the_keeper_renews_a_short_lease_for_longer_than_its_ttl() {
    let cluster = cluster("rc_renews", 27554);
    run(async {
        let admin = plain(cluster.port()).await;
        let held = held_and_renewed(cluster.port(), "report", TTL).await;
        let mut changes = held.watch();
        let renewals = Arc::new(AtomicUsize::new(0));
        let counter = renewals.clone();
        tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                counter.fetch_add(1, Ordering::SeqCst);
            }
        });
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            assert!(held.is_held(), "lost after {:?}: {:?}", start.elapsed(), held.state());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(renewals.load(Ordering::SeqCst) >= 3, "renewed {} times", renewals.load(Ordering::SeqCst));
        assert_eq!(server_lease(&admin, "report").await, Some((true, held.fence())), "live, same fence");
        assert_eq!(lease::current_fence(&admin, "report").await.unwrap(), Some(held.fence()));
        let LeaseState::Held { expires_at, .. } = held.state() else { panic!("{:?}", held.state()) };
        assert!(expires_at > SystemTime::now());
        assert!(held.release().await.unwrap());
        assert_eq!(server_lease(&admin, "report").await.map(|(live, _)| live), Some(false));
    });
}

#[test]
fn a_revoked_and_taken_over_lease_is_lost_and_its_fence_stale() {
    let cluster = cluster("rc_takeover", 27555);
    run(async {
        let mut admin = plain(cluster.port()).await;
        admin.batch_execute("CREATE TABLE progress (id int PRIMARY KEY, step int)").await.unwrap();
        admin.batch_execute("INSERT INTO progress VALUES (1, 0)").await.unwrap();
        let told = Arc::new(Mutex::new(None));
        let callback = told.clone();
        let keep = KeepOptions::default().on_lost(move |state| *callback.lock().unwrap() = Some(state));
        let held =
            hold(config(cluster.port(), "rc_keeper"), "job", &AcquireOptions::new(TTL), keep).await.unwrap();
        let old = held.fence();
        let lost = held.lost_token();

        let revoked_at = Instant::now();
        let revoked: bool = admin.query_one("SELECT fence.lease_revoke('job')", &[]).await.unwrap().get(0);
        assert!(revoked);
        let taker =
            lease::acquire(&admin, "job", &AcquireOptions::new(Duration::from_secs(60))).await.unwrap();
        let taker = taker.expect("a revoked key is free");
        assert!(taker.fence > old);
        let in_time = tokio::time::timeout(TTL + Duration::from_secs(5), lost.cancelled()).await;
        let revoke_to_told = revoked_at.elapsed();
        assert!(in_time.is_ok(), "never told");
        println!("takeover: revoke to told {revoke_to_told:?} (renewing every {:?})", TTL / 3);
        assert_eq!(held.state(), LeaseState::Lost(LossReason::Revoked));
        assert!(!held.is_held());
        // The callback runs just after `lost` wakes, on the keeper's thread.
        let heard = eventually(Duration::from_secs(2), || async { told.lock().unwrap().is_some() }).await;
        assert!(heard, "the callback was never called");
        assert_eq!(
            *told.lock().unwrap(),
            Some(LeaseState::Lost(LossReason::Revoked)),
            "the callback heard it"
        );

        // Stale writes are refused, in a transaction and through fenced_update; the new fence writes.
        let tx = admin.transaction().await.unwrap();
        let err = lease::fence_guard(&tx, "job", old).await.unwrap_err();
        assert!(matches!(err, Error::StaleFence { fence } if fence == old), "{err:?}");
        drop(tx);
        let (changes, filter) = (json!({"step": 1}), json!({"id": 1}));
        let err = lease::fenced_update(&admin, "job", old, "progress", &changes, &filter).await.unwrap_err();
        assert!(matches!(err, Error::StaleFence { .. }), "{err:?}");
        let updated = lease::fenced_update(&admin, "job", taker.fence, "progress", &changes, &filter).await;
        assert_eq!(updated.unwrap(), 1);
        assert!(!held.release().await.unwrap(), "a lost lease has nothing to release");
    });
}

#[test]
fn an_unreachable_server_ends_the_lease_at_the_local_deadline() {
    let cluster = cluster("rc_unreachable", 27556);
    run(async {
        let admin = plain(cluster.port()).await;
        let ttl = Duration::from_secs(3);
        // Just renewed: the instant to measure from.
        let held = held_and_renewed(cluster.port(), "leader", ttl).await;
        let renewed_at = Instant::now();
        let old = held.fence();
        let LeaseState::Held { expires_at, .. } = held.state() else { panic!() };
        let local_deadline = SystemTime::now() + held.deadline().saturating_duration_since(Instant::now());
        let margin = expires_at.duration_since(local_deadline);
        assert!(margin.is_ok(), "the local deadline is after the server's expiry");

        let frozen = Frozen::server(&cluster);
        let told = tokio::time::timeout(ttl + Duration::from_secs(5), held.lost()).await;
        let renewal_to_told = renewed_at.elapsed();
        let before_expiry = expires_at.duration_since(SystemTime::now());
        let still_frozen_state = held.state();
        drop(frozen);
        assert_eq!(told, Ok(LeaseState::Unknown), "told while the server was still stopped");
        assert_eq!(still_frozen_state, LeaseState::Unknown);
        assert!(!held.is_held());
        println!(
            "unreachable: last renewal to told {renewal_to_told:?} (ttl {ttl:?}); local deadline {:?} before \
             the server's expiry, told {} before it",
            margin.unwrap(),
            match before_expiry {
                Ok(ahead) => format!("{ahead:?}"),
                Err(late) => format!("-{:?}", late.duration()),
            }
        );

        // Once someone else holds it, the old fence is stale.
        let waiting = AcquireOptions::new(Duration::from_secs(60)).wait(Duration::from_secs(30));
        let taker =
            lease::acquire(&admin, "leader", &waiting).await.unwrap().expect("granted once it expired");
        assert!(taker.fence > old);
        let err = lease::fence_guard(&admin, "leader", old).await.unwrap_err();
        assert!(matches!(err, Error::StaleFence { .. }), "{err:?}");
        assert!(!held.release().await.unwrap(), "the server had expired it");
    });
}

#[test]
fn release_drop_and_a_held_key() {
    let cluster = cluster("rc_release", 27557);
    run(async {
        let admin = plain(cluster.port()).await;
        let connector = config(cluster.port(), "rc_keeper");
        let opts = AcquireOptions::new(Duration::from_secs(30));
        let held = hold(connector.clone(), "k", &opts, KeepOptions::default()).await.unwrap();
        let fence = held.fence();
        let briefly = opts.clone().wait(Duration::from_millis(200));
        let err = hold(connector.clone(), "k", &briefly, KeepOptions::default()).await.err().expect("held");
        assert!(matches!(&err, Error::WaitTimedOut { key } if key == "k"), "{err:?}");

        let token = held.lost_token();
        let mut watch = held.watch();
        drop(held);
        // Dropped: the keeper stops and releases in the background.
        assert!(
            eventually(Duration::from_secs(10), || async {
                server_lease(&admin, "k").await == Some((false, fence))
            })
            .await
        );
        // The server's commit shows before its reply reaches the keeper, which then says Released.
        tokio::time::timeout(Duration::from_secs(5), token.cancelled()).await.expect("told once released");
        assert_eq!(*watch.borrow_and_update(), LeaseState::Released);

        let held = hold(connector.clone(), "k", &opts, KeepOptions::default()).await.unwrap();
        assert!(held.fence() > fence);
        assert!(held.release().await.unwrap());
        assert_eq!(server_lease(&admin, "k").await.map(|(live, _)| live), Some(false));

        // A release on a connection the server ended is tried again on a new one.
        let held = hold(connector.clone(), "k", &opts, KeepOptions::default()).await.unwrap();
        let terminate =
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'rc_keeper'";
        admin.execute(terminate, &[]).await.unwrap();
        let watch = held.watch();
        assert!(held.release().await.unwrap(), "the release was not tried again on a new connection");
        assert_eq!(*watch.borrow(), LeaseState::Released);
        assert_eq!(server_lease(&admin, "k").await.map(|(live, _)| live), Some(false));

        // A release that finds the lease gone says so: the state is not Released.
        let held = hold(connector, "k", &opts, KeepOptions::default()).await.unwrap();
        admin.execute("SELECT fence.lease_revoke('k')", &[]).await.unwrap();
        let watch = held.watch();
        assert!(!held.release().await.unwrap());
        assert_eq!(
            *watch.borrow(),
            LeaseState::Lost(LossReason::Revoked),
            "the server said the token held nothing"
        );
    });
}

/// 100 leases kept by one client's keeper, whose 2 connections go silent at once (no reset, no
/// answer): the first call that hangs drops them both, and every lease is renewed on new ones in
/// time for its deadline.
#[test]
fn the_keepers_hung_connections_are_made_again_in_time_for_every_lease() {
    let cluster = cluster("rc_keeper_hung", 27639);
    run(async {
        let proxy = common::proxy::Proxy::start(cluster.port()).await;
        let client = pg_fence_client::FenceClient::new(config(proxy.port, "rc_keeper_hung"));
        let opts = AcquireOptions::new(Duration::from_secs(3));
        let mut kept = Vec::new();
        for index in 0..100 {
            kept.push(client.hold(&format!("hung-{index}"), &opts, KeepOptions::default()).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        proxy.hang();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(7) {
            for held in &kept {
                assert!(
                    held.is_held(),
                    "{} lost after {:?}: {:?}",
                    held.lease().key,
                    start.elapsed(),
                    held.state()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let made = client.keeper_stats().connections_made;
        assert!((3..=6).contains(&made), "the hung connections made again, a few times at most: {made}");
        for held in kept {
            assert!(held.release().await.unwrap());
        }
    });
}
