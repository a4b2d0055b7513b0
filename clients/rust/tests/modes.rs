//! Shared leases and semaphore permits: options refused before anything is sent, and leases granted,
//! refused, kept, renewed and lost as plain ones are.
mod common;
use common::{cluster, config, eventually, plain, run};
use pg_fence_client::{hold, lease, AcquireOptions, Error, FenceClient, KeepOptions, LeaseState, LossReason};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_postgres::Client;

const TTL: Duration = Duration::from_millis(1500);

/// The live holders of `key`: (fence, shared, permits), by fence.
async fn holders(admin: &Client, key: &str) -> Vec<(i64, bool, i32)> {
    let sql = "SELECT fence, shared, permits FROM fence.leases WHERE key = $1 AND live ORDER BY fence";
    let rows = admin.query(sql, &[&key]).await.unwrap();
    rows.iter().map(|row| (row.get(0), row.get(1), row.get(2))).collect()
}

#[test]
fn modes_that_cannot_work_are_refused_before_anything_is_sent() {
    run(async {
        // Nothing listens there: a call that tried to connect would fail with Connect instead.
        let nowhere = config(27569, "rc_nowhere");
        let ttl = Duration::from_secs(10);
        for bad in [AcquireOptions::new(ttl).shared(true).permits(2), AcquireOptions::new(ttl).permits(0)] {
            let err = hold(nowhere.clone(), "k", &bad, KeepOptions::default()).await.err().unwrap();
            assert!(matches!(err, Error::Config(_)), "hold {bad:?}: {err:?}");
            let err = FenceClient::new(nowhere.clone()).acquire("k", &bad).await.unwrap_err();
            assert!(matches!(err, Error::Config(_)), "FenceClient::acquire {bad:?}: {err:?}");
        }
    });
}

#[test]
fn shared_leases_coexist_and_keep_an_exclusive_one_out() {
    let cluster = cluster("rc_shared", 27570);
    run(async {
        let admin = plain(cluster.port()).await;
        let shared = AcquireOptions::new(Duration::from_secs(30)).shared(true);
        let first = lease::acquire(&admin, "doc", &shared).await.unwrap().expect("a shared lease");
        let second = lease::acquire(&admin, "doc", &shared).await.unwrap().expect("beside a shared one");
        assert!(first.shared && first.token != second.token && first.fence != second.fence);
        let exclusive = AcquireOptions::new(Duration::from_secs(30));
        assert_eq!(lease::acquire(&admin, "doc", &exclusive).await.unwrap(), None, "exclusive beside shared");
        let permit = exclusive.clone().permits(2);
        assert_eq!(lease::acquire(&admin, "doc", &permit).await.unwrap(), None, "a permit beside shared");
        assert_eq!(
            holders(&admin, "doc").await.iter().map(|h| (h.1, h.2)).collect::<Vec<_>>(),
            [(true, 1); 2]
        );

        // Kept as a plain lease is: renewed past its TTL, guarded with its own fence.
        let connector = config(cluster.port(), "rc_shared_keeper");
        let kept = AcquireOptions { ttl: TTL, ..shared.clone() };
        let held = hold(connector.clone(), "doc", &kept, KeepOptions::default()).await.unwrap();
        let mut renewals = held.watch();
        for _ in 0..4 {
            renewals.changed().await.unwrap();
        }
        assert!(held.is_held() && held.lease().shared);
        lease::fence_guard(&admin, "doc", held.fence()).await.unwrap();
        assert_eq!(holders(&admin, "doc").await.len(), 3);
        let wait = exclusive.clone().wait(Duration::from_millis(300));
        let err =
            hold(connector, "doc", &wait, KeepOptions::default()).await.err().expect("shared leases live");
        assert!(matches!(err, Error::WaitTimedOut { .. }), "{err:?}");

        assert!(held.release().await.unwrap());
        assert!(
            lease::release(&admin, &first).await.unwrap() && lease::release(&admin, &second).await.unwrap()
        );
        let writer = lease::acquire(&admin, "doc", &exclusive).await.unwrap().expect("no shared lease left");
        assert_eq!(lease::acquire(&admin, "doc", &shared).await.unwrap(), None, "shared beside exclusive");
        lease::release(&admin, &writer).await.unwrap();
    });
}

#[test]
fn permits_bound_the_kept_leases_of_a_key() {
    let cluster = cluster("rc_permits", 27571);
    run(async {
        let admin = plain(cluster.port()).await;
        let connector = config(cluster.port(), "rc_permit_keeper");
        let opts = AcquireOptions::new(TTL).permits(3);
        let mut held = Vec::new();
        for n in 0..3 {
            let worker = opts.clone().owner(format!("worker-{n}"));
            held.push(hold(connector.clone(), "pool", &worker, KeepOptions::default()).await.unwrap());
        }
        let waiting = opts.clone().wait(Duration::from_millis(300));
        let err =
            hold(connector.clone(), "pool", &waiting, KeepOptions::default()).await.err().expect("all taken");
        assert!(matches!(err, Error::WaitTimedOut { .. }), "{err:?}");
        assert_eq!(lease::acquire(&admin, "pool", &opts).await.unwrap(), None, "a fourth of three permits");

        // Past their TTL, all three are still held: each renewed with its own token.
        tokio::time::sleep(TTL * 2).await;
        assert!(held.iter().all(|h| h.is_held()));
        let live = holders(&admin, "pool").await;
        assert_eq!(
            live.iter().map(|h| h.0).collect::<Vec<_>>(),
            held.iter().map(|h| h.fence()).collect::<Vec<_>>()
        );
        assert!(live.iter().all(|h| h.2 == 3), "{live:?}");

        // A permit given back is taken by the next waiter, under a higher fence.
        let top = held.iter().map(|h| h.fence()).max().unwrap();
        let waiter = tokio::spawn(async move {
            let waiting = opts.clone().wait(Duration::from_secs(10));
            hold(connector, "pool", &waiting, KeepOptions::default()).await
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(held.remove(0).release().await.unwrap());
        let fourth = waiter.await.unwrap().unwrap();
        assert!(fourth.fence() > top);
        assert_eq!(holders(&admin, "pool").await.len(), 3);
        for h in held.into_iter().chain([fourth]) {
            assert!(h.release().await.unwrap());
        }
        assert_eq!(holders(&admin, "pool").await, []);
    });
}

#[test]
fn a_kept_permit_is_lost_when_its_key_is_revoked() {
    let cluster = cluster("rc_permit_lost", 27572);
    run(async {
        let admin = plain(cluster.port()).await;
        let told = Arc::new(Mutex::new(Vec::new()));
        let heard = told.clone();
        let keep = KeepOptions::default().on_lost(move |state| heard.lock().unwrap().push(state));
        let opts = AcquireOptions::new(TTL).permits(2);
        let held = hold(config(cluster.port(), "rc_permit_keeper"), "pool", &opts, keep).await.unwrap();
        let revoked: bool = admin.query_one("SELECT fence.lease_revoke('pool')", &[]).await.unwrap().get(0);
        assert!(revoked);
        let told_in_time = tokio::time::timeout(TTL + Duration::from_secs(5), held.lost()).await;
        assert_eq!(told_in_time, Ok(LeaseState::Lost(LossReason::Revoked)));
        assert!(
            eventually(Duration::from_secs(2), || async {
                *told.lock().unwrap() == [LeaseState::Lost(LossReason::Revoked)]
            })
            .await
        );
        let err = lease::fence_guard(&admin, "pool", held.fence()).await.unwrap_err();
        assert!(matches!(err, Error::StaleFence { .. }), "{err:?}");
        assert!(!held.release().await.unwrap());
    });
}
