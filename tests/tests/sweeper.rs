//! The sweeper background worker, in a cluster with pg_fence in shared_preload_libraries.
use pg_fence_integration::{eventually, Cluster};
use postgres::Client;
use std::thread;
use std::time::Duration;

fn worker_pid(client: &mut Client) -> Option<i32> {
    client
        .query_opt("SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_fence sweeper'", &[])
        .unwrap()
        .map(|row| row.get(0))
}

fn unswept(client: &mut Client) -> i64 {
    client
        .query_one("SELECT count(*) FROM fence.lease_state WHERE token_hash IS NOT NULL AND expires_at <= clock_timestamp()", &[])
        .unwrap()
        .get(0)
}

/// The worker runs under its own backend_type, sweeps on its interval, takes a new interval on
/// SIGHUP (it starts with one of an hour), and is restarted after pg_terminate_backend.
#[test]
fn the_sweeper_sweeps_reloads_and_comes_back() {
    let cluster = Cluster::start(
        "sweeper",
        26501,
        &["shared_preload_libraries=pg_fence", "pg_fence.database=postgres", "pg_fence.sweep_interval=1h"],
    );
    let mut client = cluster.connect();
    assert!(eventually(Duration::from_secs(10), || worker_pid(&mut client).is_some()), "no sweeper worker");

    client.query_one("SELECT fence.lease_acquire('k', '10 milliseconds')", &[]).unwrap();
    thread::sleep(Duration::from_millis(300));
    assert_eq!(unswept(&mut client), 1, "swept before its interval of an hour");

    client.batch_execute("ALTER SYSTEM SET pg_fence.sweep_interval = '100ms'").unwrap();
    client.batch_execute("SELECT pg_reload_conf()").unwrap();
    assert!(
        eventually(Duration::from_secs(5), || unswept(&mut client) == 0),
        "the reloaded interval never took effect"
    );
    let total: i64 = client.query_one("SELECT total_swept FROM fence.sweeper", &[]).unwrap().get(0);
    assert!(total >= 1);

    let pid = worker_pid(&mut client).unwrap();
    client.query_one("SELECT pg_terminate_backend($1)", &[&pid]).unwrap();
    assert!(
        eventually(Duration::from_secs(15), || worker_pid(&mut client).is_some_and(|new| new != pid)),
        "the sweeper was not restarted"
    );
    client.query_one("SELECT fence.lease_acquire('k2', '10 milliseconds')", &[]).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || unswept(&mut client) == 0),
        "the restarted sweeper does not sweep"
    );
}

/// Before CREATE EXTENSION the worker waits; after it, it sweeps; grants keep working throughout.
#[test]
fn the_sweeper_waits_for_the_extension() {
    let cluster = Cluster::start_without_extension(
        "sweeper_late",
        26502,
        &["shared_preload_libraries=pg_fence", "pg_fence.sweep_interval=100ms"],
    );
    let mut client = cluster.connect();
    assert!(eventually(Duration::from_secs(10), || worker_pid(&mut client).is_some()), "no sweeper worker");
    thread::sleep(Duration::from_millis(500));
    assert!(worker_pid(&mut client).is_some(), "the worker died without the extension");
    client.batch_execute("CREATE EXTENSION pg_fence").unwrap();
    client.query_one("SELECT fence.lease_acquire('k', '10 milliseconds')", &[]).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || unswept(&mut client) == 0),
        "nothing swept after CREATE EXTENSION"
    );
}
