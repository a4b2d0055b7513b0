//! Lease sets: every key or none, renewed and released in one call each, kept as one lease is (the
//! local deadline, lost as a whole when one of its leases is), and an acquire that is never sent
//! again after a try that may have been granted (lease_acquire_all takes no token).
mod common;
use common::proxy::{Cut, Proxy};
use common::{cluster, config, eventually, plain, run};
use pg_fence_client::{
    hold_all, lease, AcquireOptions, Backoff, Error, FenceClient, KeepOptions, LeaseState, LossReason,
};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_postgres::Client;
use uuid::Uuid;

const KEYS: [&str; 3] = ["account:2", "account:1", "account:3"];

/// The live leases of `keys`: key to fence.
async fn live(admin: &Client, keys: &[&str]) -> BTreeMap<String, i64> {
    let sql = "SELECT key, fence FROM fence.leases WHERE key = ANY($1) AND live";
    let rows = admin.query(sql, &[&keys]).await.unwrap();
    rows.iter().map(|row| (row.get(0), row.get(1))).collect()
}

#[test]
fn set_options_that_cannot_work_are_refused_before_anything_is_sent() {
    run(async {
        let nowhere = config(27569, "rc_nowhere");
        let ttl = Duration::from_secs(10);
        let bad = [
            AcquireOptions::new(ttl).token(Uuid::new_v4()),
            AcquireOptions::new(ttl).shared(true),
            AcquireOptions::new(ttl).permits(2),
        ];
        for opts in &bad {
            let err = hold_all(nowhere.clone(), &KEYS, opts, KeepOptions::default()).await.err().unwrap();
            assert!(matches!(err, Error::Config(_)), "hold_all {opts:?}: {err:?}");
            let err = FenceClient::new(nowhere.clone()).acquire_all(&KEYS, opts).await.unwrap_err();
            assert!(matches!(err, Error::Config(_)), "FenceClient::acquire_all {opts:?}: {err:?}");
        }
    });
}

#[test]
fn acquire_all_grants_every_key_or_none() {
    let cluster = cluster("rc_sets", 27573);
    run(async {
        let admin = plain(cluster.port()).await;
        let client = FenceClient::new(config(cluster.port(), "rc_sets"));
        let opts = AcquireOptions::new(Duration::from_secs(30)).owner("mover");
        let set = client.acquire_all(&KEYS, &opts).await.unwrap().expect("three free keys");
        assert_eq!(set.keys(), ["account:1", "account:2", "account:3"], "one lease per key, in key order");
        assert!(set.leases.iter().all(|l| l.token == set.token && l.owner == "mover"));
        let fences: BTreeMap<String, i64> = set.leases.iter().map(|l| (l.key.clone(), l.fence)).collect();
        assert_eq!(live(&admin, &KEYS).await, fences);
        let overlapping = client.acquire_all(&["account:3", "account:4"], &opts).await.unwrap();
        assert_eq!(overlapping, None, "none when one of them is held");
        assert_eq!(live(&admin, &["account:4"]).await.len(), 0);
        assert_eq!(lease::acquire(&admin, "account:2", &opts).await.unwrap(), None);

        let renewed = client.renew_all(&set, Duration::from_secs(60)).await.unwrap();
        assert!(renewed > set.expires_at());
        assert_eq!(client.release_all(&set).await.unwrap(), 3);
        assert_eq!(client.release_all(&set).await.unwrap(), 0, "a retried release finds nothing");
        let err = client.renew_all(&set, Duration::from_secs(30)).await.unwrap_err();
        assert!(matches!(&err, Error::LeaseLost { key, .. } if *key == set.label()), "{err:?}");

        for bad in [&["x", "x"][..], &[][..], &["x", ""][..]] {
            let err = lease::acquire_all(&admin, bad, &opts).await.unwrap_err();
            assert_eq!(err.sqlstate(), Some("22023"), "{bad:?}: {err:?}");
        }
    });
}

#[test]
fn a_held_set_is_renewed_past_its_ttl_and_released_as_one() {
    let cluster = cluster("rc_held_set", 27574);
    run(async {
        let admin = plain(cluster.port()).await;
        let connector = config(cluster.port(), "rc_set_keeper");
        let opts = AcquireOptions::new(Duration::from_millis(1500));
        let held = hold_all(connector.clone(), &KEYS, &opts, KeepOptions::default()).await.unwrap();
        let mut renewals = held.watch();
        for _ in 0..5 {
            renewals.changed().await.unwrap();
        }
        assert!(held.is_held());
        let fences: BTreeMap<String, i64> =
            held.keys().iter().map(|k| (k.to_string(), held.fence(k).unwrap())).collect();
        assert_eq!(live(&admin, &KEYS).await, fences, "all three live, under the fences granted");
        assert_eq!(held.fence("account:9"), None);
        for key in KEYS {
            lease::fence_guard(&admin, key, held.fence(key).unwrap()).await.unwrap();
        }
        let LeaseState::Held { fence, .. } = held.state() else { panic!("{:?}", held.state()) };
        assert_eq!(fence, held.fence("account:1").unwrap(), "the fence of the set's first key");

        // A set whose key is held waits for it, holding none of its keys meanwhile.
        let briefly = opts.clone().wait(Duration::from_millis(300));
        let err =
            hold_all(connector, &["account:3", "account:4"], &briefly, KeepOptions::default()).await.err();
        assert!(
            matches!(&err, Some(Error::WaitTimedOut { key }) if key == "account:3, account:4"),
            "{err:?}"
        );
        assert_eq!(live(&admin, &["account:4"]).await.len(), 0);

        let watch = held.watch();
        assert!(held.release().await.unwrap(), "every lease of the set ended");
        assert_eq!(*watch.borrow(), LeaseState::Released);
        assert_eq!(live(&admin, &KEYS).await.len(), 0);
    });
}

#[test]
fn a_held_set_is_lost_as_a_whole_when_one_key_is_revoked() {
    let cluster = cluster("rc_set_lost", 27575);
    run(async {
        let admin = plain(cluster.port()).await;
        let told = Arc::new(Mutex::new(Vec::new()));
        let heard = told.clone();
        let keep = KeepOptions::default()
            .renew_every(Duration::from_millis(300))
            .on_lost(move |state| heard.lock().unwrap().push(state));
        // A TTL of 30 s: whatever ends the other leases within seconds is not their expiry.
        let opts = AcquireOptions::new(Duration::from_secs(30));
        let held = hold_all(config(cluster.port(), "rc_set_keeper"), &KEYS, &opts, keep).await.unwrap();
        let old = held.fence("account:3").unwrap();
        let revoked: bool =
            admin.query_one("SELECT fence.lease_revoke('account:2')", &[]).await.unwrap().get(0);
        assert!(revoked);
        let told_in_time = tokio::time::timeout(Duration::from_secs(5), held.lost()).await;
        assert_eq!(
            told_in_time,
            Ok(LeaseState::Lost(LossReason::Revoked)),
            "one lease of the set revoked: the set is lost"
        );
        assert!(!held.is_held());
        assert!(
            eventually(Duration::from_secs(2), || async {
                *told.lock().unwrap() == [LeaseState::Lost(LossReason::Revoked)]
            })
            .await
        );
        let freed =
            eventually(Duration::from_secs(5), || async { live(&admin, &KEYS).await.is_empty() }).await;
        assert!(freed, "the set's other leases were left live: {:?}", live(&admin, &KEYS).await);
        let err = lease::fence_guard(&admin, "account:3", old).await.unwrap_err();
        assert!(matches!(err, Error::StaleFence { .. }), "{err:?}");
        assert!(!held.release().await.unwrap());
    });
}

#[test]
fn a_lost_reply_of_acquire_all_is_not_sent_again() {
    let cluster = cluster("rc_set_lost_reply", 27576);
    run(async {
        let admin = plain(cluster.port()).await;
        let proxy = Proxy::start(cluster.port()).await;
        let backoff = Backoff { max_attempts: Some(3), ..Backoff::default() };
        let client = FenceClient::with_backoff(config(proxy.port, "rc_proxied"), backoff.clone());
        assert_eq!(client.current_fence("warm-up").await.unwrap(), None, "connected through the proxy");
        let opts = AcquireOptions::new(Duration::from_secs(2));
        proxy.drop_reply_to("lease_acquire_all", Cut::Both);
        // Sent again, the try would find the keys held by the lost grant and return None: the
        // caller would not learn that they are held, nor by whom.
        let err = client.acquire_all(&KEYS, &opts).await.unwrap_err();
        assert!(matches!(err, Error::OutcomeUnknown(_)), "{err:?}");
        assert!(proxy.dropped_bytes() > 0, "no reply was dropped");
        assert_eq!(proxy.connections(), 1, "not sent again on a new connection");
        assert_eq!(live(&admin, &KEYS).await.len(), 3, "the lost try was granted");
        let expired = eventually(Duration::from_secs(10), || async { live(&admin, &KEYS).await.is_empty() });
        assert!(expired.await, "the lost grant ends at its TTL");

        // So does hold_all.
        proxy.drop_reply_to("lease_acquire_all", Cut::Both);
        let keep = KeepOptions { retry: backoff, ..KeepOptions::default() };
        let err = hold_all(config(proxy.port, "rc_proxied"), &KEYS, &opts, keep).await.err().unwrap();
        assert!(matches!(err, Error::OutcomeUnknown(_)), "{err:?}");
        assert_eq!(live(&admin, &KEYS).await.len(), 3);
    });
}

#[test]
fn a_session_bound_set_is_lost_the_moment_its_session_ends() {
    let cluster = cluster("rc_set_session", 27577);
    run(async {
        let admin = plain(cluster.port()).await;
        let opts = AcquireOptions::new(Duration::from_secs(30)).session_bound(true);
        let held = hold_all(config(cluster.port(), "rc_set_session"), &KEYS, &opts, KeepOptions::default())
            .await
            .unwrap();
        let terminate =
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'rc_set_session'";
        admin.execute(terminate, &[]).await.unwrap();
        // The next renewal is 10 s away: told within 5 s means the closed session told it.
        let told = tokio::time::timeout(Duration::from_secs(5), held.lost()).await;
        assert_eq!(told.expect("told before the next renewal"), LeaseState::Lost(LossReason::SessionEnded));
        assert!(eventually(Duration::from_secs(5), || async { live(&admin, &KEYS).await.is_empty() }).await);
    });
}

#[test]
fn a_set_kept_by_the_clients_keeper_is_renewed_there_and_lost_as_a_whole() {
    let cluster = cluster("rc_set_by_client", 27636);
    run(async {
        let admin = plain(cluster.port()).await;
        let client = FenceClient::new(config(cluster.port(), "rc_set_client"));
        let told = Arc::new(Mutex::new(Vec::new()));
        let heard = told.clone();
        let keep = KeepOptions::default().on_lost(move |state| heard.lock().unwrap().push(state));
        let opts = AcquireOptions::new(Duration::from_millis(1500));
        let held = client.hold_all(&KEYS, &opts, keep).await.unwrap();
        let mut renewals = held.watch();
        for _ in 0..5 {
            renewals.changed().await.unwrap();
        }
        assert!(held.is_held(), "renewed past its TTL");
        let keeper = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'rc_set_client_keeper'";
        let open: i64 = admin.query_one(keeper, &[]).await.unwrap().get(0);
        assert_eq!(open, 2, "the keeper's two connections, made before the acquire");
        assert_eq!(client.keeper_stats().connections_made, 2, "and kept: the set is renewed on them");
        admin.query_one("SELECT fence.lease_revoke('account:2')", &[]).await.unwrap();
        let lost = tokio::time::timeout(Duration::from_secs(3), held.lost()).await;
        assert_eq!(
            lost,
            Ok(LeaseState::Lost(LossReason::Revoked)),
            "the reason, asked on the keeper's connection"
        );
        let freed =
            eventually(Duration::from_secs(5), || async { live(&admin, &KEYS).await.is_empty() }).await;
        assert!(freed, "the set's other leases were released: {:?}", live(&admin, &KEYS).await);
        assert_eq!(*told.lock().unwrap(), [LeaseState::Lost(LossReason::Revoked)]);
    });
}
