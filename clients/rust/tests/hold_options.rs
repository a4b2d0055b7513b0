//! `hold` and what it leaves behind: options refused before anything is sent, no lease left live
//! when it fails after the grant, and no statement_timeout left on a connection that may be pooled.
mod common;
use common::proxy::{Cut, Proxy};
use common::{cluster, config, plain, run, server_lease};
use pg_fence_client::{hold, lease, AcquireOptions, Connector, Error, KeepOptions, PgConnection};
use std::ops::Deref;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_postgres::{Client, Config};

#[test]
fn a_renew_every_that_cannot_keep_the_lease_is_refused() {
    run(async {
        // Nothing listens there: the options are refused before connecting.
        let nowhere = config(27569, "rc_nowhere");
        let ttl = Duration::from_secs(10);
        for every in [Duration::ZERO, ttl, ttl - Duration::from_millis(50)] {
            let keep = KeepOptions::default().renew_every(every);
            let err = hold(nowhere.clone(), "k", &AcquireOptions::new(ttl), keep).await.err().unwrap();
            assert!(matches!(err, Error::Config(_)), "renew_every {every:?}: {err:?}");
        }
    });
}

#[test]
fn a_failed_renewal_at_once_releases_the_lease_it_was_for() {
    let cluster = cluster("rc_renew_at_once", 27566);
    run(async {
        let admin = plain(cluster.port()).await;
        let blocker = lease::acquire(&admin, "k", &AcquireOptions::new(Duration::from_secs(60))).await;
        let blocker = blocker.unwrap().unwrap();
        let proxy = Proxy::start(cluster.port()).await;
        // Granted after a wait longer than renew_every, so hold renews at once; that reply is lost.
        proxy.drop_reply_to("lease_renew", Cut::Both);
        let opts = AcquireOptions::new(Duration::from_secs(30)).wait(Duration::from_secs(10));
        let keep = KeepOptions::default().renew_every(Duration::from_millis(100));
        let connector = config(proxy.port, "rc_at_once");
        let holding = tokio::spawn(async move { hold(connector, "k", &opts, keep).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(lease::release(&admin, &blocker).await.unwrap());
        let err = holding.await.unwrap().err().expect("the renewal's reply was lost");
        assert!(matches!(err, Error::OutcomeUnknown(_)), "{err:?}");
        assert!(proxy.dropped_bytes() > 0);
        assert_eq!(server_lease(&admin, "k").await.map(|(live, _)| live), Some(false), "not left live");
    });
}

/// Hands out connections as a pool would, and keeps them to look at afterwards.
#[derive(Clone)]
struct Kept(Config, Arc<Mutex<Vec<Arc<PgConnection>>>>);
struct Shared(Arc<PgConnection>);

impl Deref for Shared {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.0
    }
}

impl Connector for Kept {
    type Conn = Shared;

    async fn connect(&self) -> Result<Shared, pg_fence_client::BoxError> {
        let conn = Arc::new(Connector::connect(&self.0).await?);
        self.1.lock().unwrap().push(conn.clone());
        Ok(Shared(conn))
    }
}

#[test]
fn the_keeper_leaves_no_statement_timeout_on_its_connection() {
    let cluster = cluster("rc_pooled", 27567);
    run(async {
        let kept = Kept(config(cluster.port(), "rc_pooled"), Arc::default());
        let opts = AcquireOptions::new(Duration::from_millis(1500));
        let held = hold(kept.clone(), "k", &opts, KeepOptions::default()).await.unwrap();
        let mut renewals = held.watch();
        renewals.changed().await.unwrap();
        renewals.changed().await.unwrap();
        assert!(held.release().await.unwrap());
        let conns = kept.1.lock().unwrap().clone();
        assert_eq!(conns.len(), 1);
        let row = conns[0].query_one("SHOW statement_timeout", &[]).await.unwrap();
        assert_eq!(row.get::<_, String>(0), "0", "the server's default, after two renewals");
    });
}
