//! The elector beyond the shared behaviours (tests/behaviours.rs): on_new_leader, a campaign's own
//! wait, `release_on_cancel(false)`, calls of a leadership that has ended, and its options.
mod common;
use common::{cluster, config, eventually, plain, run};
use pg_fence_client::{AcquireOptions, ElectOptions, Elector, Error, Leader, LossReason, StopReason};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn opts(ttl: Duration) -> ElectOptions {
    ElectOptions::new(AcquireOptions::new(ttl))
}

type Told = Arc<Mutex<Vec<Option<(i64, String)>>>>;

/// Whether on_new_leader was told `want`, in that order, after the present it is told first: the
/// vacancy, when its first look came before the campaign won.
fn is(told: &Told, want: &[Option<(i64, &str)>]) -> bool {
    let told = told.lock().unwrap();
    let mut told: Vec<_> =
        told.iter().map(|leader| leader.as_ref().map(|(fence, owner)| (*fence, owner.as_str()))).collect();
    if told.first() == Some(&None) {
        told.remove(0);
    }
    told == want
}

async fn waiters(admin: &tokio_postgres::Client, key: &str) -> i32 {
    admin.query_one("SELECT fence.waiters($1)", &[&key]).await.unwrap().get(0)
}

#[test]
fn the_elector_beyond_the_behaviours() {
    let cluster = cluster("rc_elector", 27595);
    let port = cluster.port();
    run(async {
        let admin = plain(port).await;
        let ttl = Duration::from_secs(5);

        // on_new_leader is told every change: the leader, a proclaim, the vacancy.
        let told: Told = Arc::default();
        let into = told.clone();
        let watching = opts(ttl).on_new_leader(move |leader: Option<Leader>| {
            into.lock().unwrap().push(leader.map(|leader| (leader.fence, leader.owner)))
        });
        let elector = Elector::new(config(port, "rc_elector"), "told", watching);
        let leadership = elector.campaign("v1").await.unwrap();
        let fence = leadership.fence();
        let five = Duration::from_secs(5);
        assert!(eventually(five, || async { is(&told, &[Some((fence, "v1"))]) }).await, "{told:?}");
        leadership.proclaim("v2").await.unwrap();
        assert_eq!(leadership.value(), "v2");
        let both = [Some((fence, "v1")), Some((fence, "v2"))];
        assert!(eventually(five, || async { is(&told, &both) }).await, "{told:?}");
        assert!(leadership.resign().await.unwrap());
        let all = [both[0], both[1], None];
        assert!(eventually(five, || async { is(&told, &all) }).await, "{told:?}");
        drop(elector);

        // A campaign waits as long as asked, and leaves nobody waiting.
        let holder = Elector::new(config(port, "rc_elector"), "busy", opts(ttl));
        let other = Elector::new(config(port, "rc_elector"), "busy", opts(ttl));
        let held = holder.campaign("a").await.unwrap();
        let started = Instant::now();
        let err = other.campaign_for("b", Duration::from_millis(500)).await.err().expect("not elected");
        assert!(matches!(&err, Error::WaitTimedOut { key } if key == "busy"), "{err:?}");
        assert!(
            started.elapsed() >= Duration::from_millis(500) && started.elapsed() < Duration::from_secs(5)
        );
        assert_eq!(waiters(&admin, "busy").await, 0);

        // An ended leadership can neither proclaim nor hand off: the server says why.
        admin.execute("SELECT fence.lease_revoke('busy')", &[]).await.unwrap();
        let err = held.proclaim("b").await.unwrap_err();
        assert!(matches!(err, Error::LeaseLost { reason: Some(LossReason::Revoked), .. }), "{err:?}");
        let err = held.handoff("b").await.unwrap_err();
        assert!(matches!(err, Error::LeaseLost { reason: Some(LossReason::Revoked), .. }), "{err:?}");
        assert_eq!(held.stopped_reason(), Some(StopReason::Lost(LossReason::Revoked)));
        assert_eq!(holder.leader().await.unwrap(), None);

        // Without release on cancel, a dropped leadership is left to expire at its TTL.
        let stopped: Arc<Mutex<Vec<StopReason>>> = Arc::default();
        let into = stopped.clone();
        let keeping = opts(Duration::from_millis(1500))
            .release_on_cancel(false)
            .on_stopped_leading(move |reason| into.lock().unwrap().push(reason));
        let elector = Elector::new(config(port, "rc_elector"), "kept", keeping);
        let leadership = elector.campaign("a").await.unwrap();
        let fence = leadership.fence();
        drop(leadership);
        let cancelled = || async { *stopped.lock().unwrap() == [StopReason::Cancelled] };
        assert!(eventually(Duration::from_secs(5), cancelled).await, "{stopped:?}");
        let leader = elector.leader().await.unwrap().map(|leader| leader.fence);
        assert_eq!(leader, Some(fence), "released, though asked not to");
        let expired = || async { elector.leader().await.unwrap().is_none() };
        assert!(eventually(Duration::from_secs(5), expired).await, "renewed after the cancel");

        // A leadership's lease is exclusive.
        let shared = ElectOptions::new(AcquireOptions::new(ttl).shared(true));
        let err = Elector::new(config(port, "rc_elector"), "shared", shared).campaign("a").await.err();
        assert!(matches!(err, Some(Error::Config(_))), "{err:?}");
    });
}
