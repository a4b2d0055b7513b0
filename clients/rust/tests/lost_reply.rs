//! Retries through `FenceClient`: after a reply lost with its connection, the retried acquire (same
//! token, chosen by the library before the first try) returns the lease that reply carried.
mod common;
use common::proxy::{Cut, Proxy};
use common::{backends, cluster, config, eventually, plain, run, stop};
use pg_fence_client::{hold, lease, AcquireOptions, Backoff, Error, FenceClient, KeepOptions};
use std::time::Duration;
use uuid::Uuid;

#[test]
fn a_retried_acquire_returns_the_lease_whose_reply_was_lost() {
    let cluster = cluster("rc_lost_reply", 27552);
    run(async {
        let proxy = Proxy::start(cluster.port()).await;
        let client = FenceClient::new(config(proxy.port, "rc_proxied"));
        assert_eq!(client.current_fence("report").await.unwrap(), None, "connected through the proxy");

        // The acquire is one round trip (Parse/Bind/Execute/Sync), so its reply comes after its
        // commit: dropping it leaves a granted lease whose token only the client knows.
        proxy.drop_reply_to("lease_acquire", Cut::Both);
        let opts = AcquireOptions::new(Duration::from_secs(3600));
        let lease = client.acquire("report", &opts).await.unwrap();
        assert!(proxy.dropped_bytes() > 0, "no reply was dropped");
        assert_eq!(proxy.connections(), 2, "the retry reconnected");
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
fn same_token_same_lease_and_reconnects_after_a_terminate_or_a_restart() {
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

        // A restart longer than the pauses of the old default's ten tries add up to (9.15 s at
        // most): the default retries until its 30 s have passed, so the call outlives it.
        tokio::task::block_in_place(|| stop(&cluster));
        let restart = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(10));
            cluster.restart();
            cluster
        });
        let released = client.release(&first).await;
        let _cluster = tokio::task::block_in_place(|| restart.join().unwrap());
        assert!(released.unwrap(), "gave up before the server was back");
    });
}

#[test]
fn a_refused_connection_is_not_an_unknown_outcome() {
    run(async {
        let nowhere = config(27569, "rc_nowhere"); // nothing listens there
        let briefly = Backoff { max_elapsed: Some(Duration::from_millis(500)), ..Backoff::default() };
        let client = FenceClient::with_backoff(nowhere.clone(), briefly.clone());
        let opts = AcquireOptions::new(Duration::from_secs(60));
        let err = client.acquire("k", &opts).await.unwrap_err();
        assert!(matches!(err, Error::Connect(_)), "nothing reached the server: {err:?}");
        let keep = KeepOptions { retry: briefly, ..KeepOptions::default() };
        let err = hold(nowhere, "k", &opts, keep).await.err().unwrap();
        assert!(matches!(err, Error::Connect(_)), "nothing reached the server: {err:?}");
    });
}

#[test]
fn a_session_ended_by_the_server_mid_call_leaves_the_outcome_unknown() {
    let cluster = cluster("rc_terminated", 27568);
    run(async {
        let admin = plain(cluster.port()).await;
        lease::acquire(&admin, "w", &AcquireOptions::new(Duration::from_secs(60))).await.unwrap().unwrap();
        // One try: the 57P01 that ends it is what is left at the end of the retries.
        let once = Backoff { max_attempts: Some(1), ..Backoff::default() };
        let client = FenceClient::with_backoff(config(cluster.port(), "rc_waiter"), once);
        let opts = AcquireOptions::new(Duration::from_secs(60)).wait(Duration::from_secs(30));
        let waiting = tokio::spawn(async move { client.acquire("w", &opts).await });
        assert!(
            eventually(Duration::from_secs(10), || async { backends(&admin, "rc_waiter").await.len() == 1 })
                .await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        admin
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'rc_waiter'",
                &[],
            )
            .await
            .unwrap();
        // Terminated during a commit's wait for a synchronous standby, the commit would stay.
        let err = waiting.await.unwrap().unwrap_err();
        let Error::OutcomeUnknown(source) = &err else { panic!("{err:?}") };
        let ended = source.downcast_ref::<Error>().and_then(Error::sqlstate);
        assert_eq!(ended, Some("57P01"), "{err:?}");
    });
}

#[test]
fn a_waiting_acquire_broken_by_a_restart_retries_for_max_elapsed_from_the_failure() {
    let cluster = cluster("rc_wait_restart", 27911);
    run(async {
        let holder = FenceClient::new(config(cluster.port(), "rc_holder"));
        let held =
            holder.acquire("job", &AcquireOptions::new(Duration::from_secs(60))).await.unwrap().unwrap();
        let retry = Backoff { max_elapsed: Some(Duration::from_secs(8)), ..Backoff::default() };
        let waiter = FenceClient::with_backoff(config(cluster.port(), "rc_waiter"), retry);
        let opts = AcquireOptions::new(Duration::from_secs(60)).wait(Duration::from_secs(600));
        let waiting = tokio::spawn(async move { waiter.acquire("job", &opts).await });
        let admin = plain(cluster.port()).await;
        let sql = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'rc_waiter' AND wait_event_type = 'Extension'";
        let waits = || async { admin.query_one(sql, &[]).await.unwrap().get::<_, i64>(0) == 1 };
        assert!(eventually(Duration::from_secs(60), waits).await, "the waiter waits on the server");
        // Waited longer than max_elapsed when the restart breaks the wait: the retries' time must
        // count from that failure.
        tokio::time::sleep(Duration::from_secs(10)).await;
        tokio::task::block_in_place(|| {
            stop(&cluster);
            cluster.restart();
        });
        assert!(holder.release(&held).await.unwrap());
        let granted = waiting.await.unwrap();
        assert!(matches!(granted, Ok(Some(_))), "the waiter gave up on the restart: {granted:?}");
    });
}

#[test]
fn a_refused_login_is_tried_once() {
    let cluster = cluster("rc_refused_login", 27912);
    run(async {
        let admin = plain(cluster.port()).await;
        admin.batch_execute("CREATE ROLE rc_pw LOGIN PASSWORD 'right'").await.unwrap();
        let hba = cluster.log_path().with_file_name("pg_hba.conf");
        let rules = std::fs::read_to_string(&hba).unwrap();
        std::fs::write(&hba, format!("host all rc_pw 127.0.0.1/32 scram-sha-256\n{rules}")).unwrap();
        admin.batch_execute("SELECT pg_reload_conf()").await.unwrap();
        let mut wrong = config(cluster.port(), "rc_wrong");
        wrong.user("rc_pw").password("wrong");
        let client = FenceClient::new(wrong);
        let err = client.acquire("job", &AcquireOptions::new(Duration::from_secs(60))).await.unwrap_err();
        assert_eq!(err.sqlstate(), Some("28P01"), "{err:?}");
        assert!(err.is_refused_login(), "{err:?}");
        let log = std::fs::read_to_string(cluster.log_path()).unwrap();
        let logins = log.matches(r#"password authentication failed for user "rc_pw""#).count();
        assert_eq!(logins, 1, "retrying only repeats the refusal");
    });
}

#[test]
fn a_login_refused_after_a_lost_reply_leaves_the_outcome_unknown() {
    let cluster = cluster("rc_lost_then_refused", 27559);
    run(async {
        let admin = plain(cluster.port()).await;
        admin
            .batch_execute("CREATE ROLE rc_rotated LOGIN PASSWORD 'before' IN ROLE fence_user")
            .await
            .unwrap();
        let hba = cluster.log_path().with_file_name("pg_hba.conf");
        let rules = std::fs::read_to_string(&hba).unwrap();
        std::fs::write(&hba, format!("host all rc_rotated 127.0.0.1/32 scram-sha-256\n{rules}")).unwrap();
        admin.batch_execute("SELECT pg_reload_conf()").await.unwrap();
        let proxy = Proxy::start(cluster.port()).await;
        let mut rotated = config(proxy.port, "rc_rotated");
        rotated.user("rc_rotated").password("before");
        let once = Backoff { max_attempts: Some(3), ..Backoff::default() };
        let client = FenceClient::with_backoff(rotated, once);
        assert_eq!(client.current_fence("report").await.unwrap(), None, "connected through the proxy");
        // The password rotated under a connected client: its next connection is refused.
        admin.batch_execute("ALTER ROLE rc_rotated PASSWORD 'after'").await.unwrap();
        proxy.drop_reply_to("lease_acquire", Cut::Both);
        let err =
            client.acquire("report", &AcquireOptions::new(Duration::from_secs(3600))).await.unwrap_err();
        assert!(proxy.dropped_bytes() > 0, "no reply was dropped");
        // The first try's grant may stand: a refused reconnect must not say that nothing was granted.
        let Error::OutcomeUnknown(source) = &err else { panic!("not an unknown outcome: {err:?}") };
        let refused = source.downcast_ref::<Error>().and_then(Error::sqlstate);
        assert_eq!(refused, Some("28P01"), "{err:?}");
        assert!(lease::current_fence(&admin, "report").await.unwrap().is_some(), "the lost reply's grant");
    });
}
