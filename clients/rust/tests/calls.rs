//! The one-statement calls of `lease`, against a real server.
mod common;
use common::{cluster, connect, eventually, run, server_lease};
use pg_fence_client::{lease, AcquireOptions, Error, APPLICATION_NAME};
use std::time::{Duration, SystemTime};
use uuid::Uuid;

#[test]
fn acquire_renew_release_round_trip() {
    let cluster = cluster("rc_calls", 27550);
    run(async {
        let conn = connect(cluster.port()).await;
        let opts = AcquireOptions::new(Duration::from_secs(30)).owner("billing-7");
        let lease =
            lease::acquire(&*conn, "invoice:42", &opts).await.unwrap().expect("a free key is granted");
        assert_eq!(
            (lease.key.as_str(), lease.owner.as_str(), lease.durable),
            ("invoice:42", "billing-7", true)
        );
        assert!(lease.expires_at > SystemTime::now() && lease.acquired_at < lease.expires_at);
        assert_eq!(lease::current_fence(&*conn, "invoice:42").await.unwrap(), Some(lease.fence));

        // Refused: None, not a lease made of a row of NULLs.
        let other = lease::acquire(&*conn, "invoice:42", &AcquireOptions::new(Duration::from_secs(5))).await;
        assert_eq!(other.unwrap(), None);

        let renewed = lease::renew(&*conn, &lease, Duration::from_secs(60)).await.unwrap();
        assert!(renewed > lease.expires_at);
        assert!(lease::release(&*conn, &lease).await.unwrap());
        assert!(!lease::release(&*conn, &lease).await.unwrap(), "a second release finds nothing");
        let lost = lease::renew(&*conn, &lease, Duration::from_secs(60)).await.unwrap_err();
        assert!(matches!(&lost, Error::LeaseLost { key, .. } if key == "invoice:42"), "{lost:?}");
        assert_eq!(lost.sqlstate(), Some("PF001"));

        // The next holder gets a higher fence; the old one is stale.
        let next = lease::acquire(&*conn, "invoice:42", &opts).await.unwrap().unwrap();
        assert!(next.fence > lease.fence);
        let stale = lease::fence_guard(&*conn, "invoice:42", lease.fence).await.unwrap_err();
        assert!(matches!(stale, Error::StaleFence { fence } if fence == lease.fence), "{stale:?}");
        lease::fence_guard(&*conn, "invoice:42", next.fence).await.unwrap();
    });
}

#[test]
fn defaults_fast_leases_bad_input_and_cancelled_waits() {
    let cluster = cluster("rc_inputs", 27551);
    run(async {
        let conn = connect(cluster.port()).await;
        let fast = AcquireOptions::new(Duration::from_secs(30)).durable(false);
        let lease = lease::acquire(&*conn, "cache:1", &fast).await.unwrap().unwrap();
        assert_eq!((lease.owner.as_str(), lease.durable), (APPLICATION_NAME, false));
        let durable: bool = conn
            .query_one("SELECT durable FROM fence.leases WHERE key = 'cache:1'", &[])
            .await
            .unwrap()
            .get(0);
        assert!(!durable);

        let count = "SELECT count(*) FROM fence.leases";
        let before: i64 = conn.query_one(count, &[]).await.unwrap().get(0);
        let ttl = Duration::from_secs(30);
        let bad = [
            ("", AcquireOptions::new(ttl)),
            ("k", AcquireOptions::new(Duration::ZERO)),
            ("k", AcquireOptions::new(ttl).token(Uuid::nil())),
        ];
        for (key, opts) in &bad {
            let err = lease::acquire(&*conn, key, opts).await.unwrap_err();
            assert!(matches!(err, Error::Db(_)), "{key:?} {opts:?}: {err:?}");
            assert_eq!(err.sqlstate(), Some("22023"), "{key:?} {opts:?}: {err}");
        }
        let after: i64 = conn.query_one(count, &[]).await.unwrap().get(0);
        assert_eq!(after, before, "a refused call changed nothing");
        assert_eq!(server_lease(&conn, "k").await, None);

        // A waiting acquire that statement_timeout ends is WaitCancelled, and grants nothing.
        conn.batch_execute("SET statement_timeout = '200ms'").await.unwrap();
        let waiting = AcquireOptions::new(ttl).wait(Duration::from_secs(20));
        let err = lease::acquire(&*conn, "cache:1", &waiting).await.unwrap_err();
        assert!(matches!(err, Error::WaitCancelled(_)), "{err:?}");
        conn.batch_execute("RESET statement_timeout").await.unwrap();
        assert_eq!(lease::current_fence(&*conn, "cache:1").await.unwrap(), Some(lease.fence));

        // So is one that lock_timeout ends: second in line, it queues for a lock behind the first.
        let first = connect(cluster.port()).await;
        let ahead = waiting.clone().wait(Duration::from_secs(3));
        let ahead = tokio::spawn(async move { lease::acquire(&*first, "cache:1", &ahead).await.map(drop) });
        let first_in_line = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Extension' \
                             AND query LIKE '%lease_acquire%'";
        let queued = eventually(Duration::from_secs(10), || async {
            conn.query_one(first_in_line, &[]).await.unwrap().get::<_, i64>(0) == 1
        });
        assert!(queued.await, "the first waiter never waited");
        conn.batch_execute("SET lock_timeout = '200ms'").await.unwrap();
        let err = lease::acquire(&*conn, "cache:1", &waiting).await.unwrap_err();
        assert!(matches!(err, Error::WaitCancelled(_)), "{err:?}");
        assert_eq!(err.sqlstate(), Some("55P03"));
        ahead.await.unwrap().unwrap();
    });
}

#[test]
fn renew_many_and_the_first_free_key() {
    let cluster = cluster("rc_many", 27632);
    run(async {
        let conn = connect(cluster.port()).await;
        let opts = AcquireOptions::new(Duration::from_secs(30));
        let a = lease::acquire(&*conn, "many:a", &opts).await.unwrap().unwrap();
        let b = lease::acquire(&*conn, "many:b", &opts).await.unwrap().unwrap();
        assert!(lease::release(&*conn, &a).await.unwrap());
        // One answer per lease, in order: None for the one its token no longer holds.
        let renewed = lease::renew_many(&*conn, &[&a, &b], Duration::from_secs(60)).await.unwrap();
        assert_eq!(renewed.len(), 2);
        assert_eq!(renewed[0], None);
        assert!(renewed[1].is_some_and(|at| at > b.expires_at), "{renewed:?}");

        // The first free key of the list, in order; None when none is.
        let keys = ["any:0", "any:1", "any:2"];
        let other = lease::acquire(&*conn, "any:0", &opts).await.unwrap().unwrap();
        let first = lease::acquire_any(&*conn, &keys, &opts.clone().owner("w")).await.unwrap().unwrap();
        assert_eq!((first.key.as_str(), first.owner.as_str()), ("any:1", "w"));
        let again = opts.clone().token(first.token);
        let same = lease::acquire_any(&*conn, &keys, &again).await.unwrap().unwrap();
        assert_eq!((same.key.as_str(), same.fence), ("any:1", first.fence), "a retry gets its lease");
        let next = lease::acquire_any(&*conn, &keys, &opts).await.unwrap().unwrap();
        assert_eq!(next.key, "any:2");
        assert_eq!(lease::acquire_any(&*conn, &keys, &opts).await.unwrap(), None, "none free");
        let waiting = lease::acquire_any(&*conn, &keys, &opts.clone().wait(Duration::from_secs(1))).await;
        assert!(matches!(waiting, Err(Error::Config(_))), "{waiting:?}");
        for held in [other, first, next] {
            assert!(lease::release(&*conn, &held).await.unwrap());
        }
    });
}
