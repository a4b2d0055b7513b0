//! Shared by the integration tests: scratch clusters come from the repository's harness
//! (tests/src/lib.rs); the tests talk to them through this crate and tokio-postgres.
#![allow(dead_code)]
pub mod proxy;
pub mod scenarios;
use pg_fence_client::{hold, AcquireOptions, Connector, HeldLease, KeepOptions, LeaseState, PgConnection};
use pg_fence_integration::Cluster;
#[allow(unused_imports)] // not every test crate that shares this module stops a server
pub use pg_fence_integration::Frozen;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_postgres::{Client, Config, NoTls};

/// A cluster for one test. fsync is off only to keep parallel tests quick: a kill -9 of the server
/// loses nothing the OS has, so crash tests still see only what each commit flushed to the OS.
pub fn cluster(name: &str, port: u16) -> Cluster {
    Cluster::start(name, port, &["fsync=off"])
}

/// A fast shutdown of the server (`pg_test/cluster stop`); `Cluster::restart` starts it again.
pub fn stop(cluster: &Cluster) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../pg_test/cluster");
    let status = std::process::Command::new(script).args(["stop", cluster.name()]).status().unwrap();
    assert!(status.success(), "pg_test/cluster stop {} failed", cluster.name());
}

/// Runs an async test body on a two-worker runtime (so blocking harness calls in `block_in_place`
/// leave the keeper a thread).
pub fn run<F: Future>(body: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap().block_on(body)
}

pub fn config(port: u16, application_name: &str) -> Config {
    format!("host=127.0.0.1 port={port} user=postgres dbname=postgres application_name={application_name}")
        .parse()
        .unwrap()
}

/// A connection as the library makes them (but for its application_name).
pub async fn connect(port: u16) -> PgConnection {
    let mut config = config(port, "x");
    config.application_name(pg_fence_client::APPLICATION_NAME);
    Connector::connect(&config).await.unwrap()
}

/// `key` held with `ttl` and the default keep options, by a keeper whose connections have
/// application_name rc_keeper; returned once it has renewed the lease at least once.
pub async fn held_and_renewed(port: u16, key: &str, ttl: Duration) -> HeldLease {
    let opts = AcquireOptions::new(ttl);
    let held = hold(config(port, "rc_keeper"), key, &opts, KeepOptions::default()).await.unwrap();
    held.watch().changed().await.unwrap();
    held
}

/// What `on_lost` was told, and when.
pub type Told = Arc<Mutex<Vec<(LeaseState, Instant)>>>;

/// `keep` with an `on_lost` that records what it was told, and when.
pub fn recording_losses(keep: KeepOptions) -> (KeepOptions, Told) {
    let told = Told::default();
    let heard = told.clone();
    let keep = keep.on_lost(move |state| heard.lock().unwrap().push((state, Instant::now())));
    (keep, told)
}

/// The pids of the backends whose application_name is `name`.
pub async fn backends(admin: &Client, name: &str) -> Vec<i32> {
    let rows = admin.query("SELECT pid FROM pg_stat_activity WHERE application_name = $1", &[&name]).await;
    rows.unwrap().iter().map(|row| row.get(0)).collect()
}

/// The backend `key`'s session-bound lease is bound to.
pub async fn session_pid(admin: &Client, key: &str) -> Option<i32> {
    let row = admin.query_opt("SELECT session_pid FROM fence.leases WHERE key = $1", &[&key]).await.unwrap();
    row.and_then(|row| row.get(0))
}

/// A plain client, for transactions (they need `&mut Client`).
pub async fn plain(port: u16) -> Client {
    let (client, connection) = config(port, "rc_admin").connect(NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// Polls `check` until it is true or `limit` passed. Limits bound how long a failing test hangs;
/// they do not measure speed.
pub async fn eventually<F: Future<Output = bool>>(limit: Duration, mut check: impl FnMut() -> F) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

/// Whether `key`'s lease is live by the server, and its fence.
pub async fn server_lease(client: &Client, key: &str) -> Option<(bool, i64)> {
    let row = client.query_opt("SELECT live, fence FROM fence.leases WHERE key = $1", &[&key]).await.unwrap();
    row.map(|row| (row.get(0), row.get(1)))
}
