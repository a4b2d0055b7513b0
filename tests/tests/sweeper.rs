//! The sweeper background worker, in a cluster with pg_fence in shared_preload_libraries.
use pg_fence_integration::{eventually, sqlstate, Cluster};
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

/// fence.sweep() called by hand, without the worker: it marks expired leases free and keeps their
/// fences; it is for fence_admin; and it never runs inside a transaction block, where the rows it
/// swept would stay locked, and their next acquirers waiting, for as long as the block stays open.
#[test]
fn a_sweep_by_hand_frees_expired_leases_and_is_for_fence_admin_in_its_own_transaction() {
    let cluster = Cluster::start("sweep_by_hand", 26503, &[]);
    let mut client = cluster.connect();
    client
        .batch_execute(
            "SELECT fence.lease_acquire('expired', '10 ms'); SELECT fence.lease_acquire('live', '1 minute');
             SELECT pg_sleep(0.03);",
        )
        .unwrap();
    assert_eq!(client.query_one("SELECT fence.sweep()", &[]).unwrap().get::<_, i64>(0), 1);
    assert_eq!(client.query_one("SELECT fence.sweep()", &[]).unwrap().get::<_, i64>(0), 0, "nothing left");
    let row = client
        .query_one(
            "SELECT (SELECT token_hash IS NULL FROM fence.lease_state WHERE key = 'expired'),
                    (SELECT live FROM fence.leases WHERE key = 'live'), total_swept, last_swept FROM fence.sweeper",
            &[],
        )
        .unwrap();
    assert!(row.get::<_, bool>(0) && row.get::<_, bool>(1));
    assert_eq!((row.get::<_, i64>(2), row.get::<_, i64>(3)), (1, 0));
    let next: Option<i64> =
        client.query_one("SELECT (fence.lease_acquire('expired', '1 minute')).fence", &[]).unwrap().get(0);
    assert_eq!(next, Some(2), "the fence counter survives sweeping");

    let err = client.batch_execute("BEGIN; SELECT fence.sweep();").unwrap_err();
    assert_eq!(sqlstate(&err), "25001", "{err}");
    client.batch_execute("ROLLBACK; CREATE ROLE app LOGIN; GRANT fence_user TO app").unwrap();
    let mut app = cluster.connect_as("app");
    let err = app.query_one("SELECT fence.sweep()", &[]).unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "an ordinary role may sweep: {err}");
    let err = app.query_one("SELECT fence.lease_revoke('live')", &[]).unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "{err}");
    client.batch_execute("GRANT fence_admin TO app").unwrap();
    assert_eq!(app.query_one("SELECT fence.sweep()", &[]).unwrap().get::<_, i64>(0), 0);
}

/// A sweep that finds the sweeper's figures locked (another sweep, or anyone holding that row)
/// returns at once without sweeping. pg_fence 0.3.0 swept first and then waited for the figures'
/// row, holding the rows it had swept, so the next acquirers of those keys waited too.
#[test]
fn a_sweep_never_waits_while_holding_swept_leases() {
    let cluster = Cluster::start("sweep_no_wait", 26504, &[]);
    let mut client = cluster.connect();
    client.batch_execute("SELECT fence.lease_acquire('expired', '10 ms'); SELECT pg_sleep(0.03);").unwrap();
    let mut figures = cluster.connect();
    figures.batch_execute("BEGIN; SELECT * FROM fence.sweeper_stats FOR UPDATE;").unwrap();

    let mut sweeper = cluster.connect();
    let sweep = thread::spawn(move || {
        sweeper.batch_execute("SET statement_timeout = '10s'").unwrap();
        sweeper
            .query_one("SELECT fence.sweep()", &[])
            .map(|row| row.get::<_, i64>(0))
            .map_err(|e| sqlstate(&e))
    });
    thread::sleep(Duration::from_millis(300));
    client.batch_execute("SET lock_timeout = '2s'").unwrap();
    let granted = client.query_one("SELECT (fence.lease_acquire('expired', '1 minute')).fence", &[]);
    let granted: Option<i64> =
        granted.map_err(|e| sqlstate(&e)).expect("the acquirer waited for the sweep").get(0);
    assert_eq!(granted, Some(2));
    figures.batch_execute("COMMIT").unwrap();
    assert_eq!(sweep.join().unwrap(), Ok(0), "a sweep ran while another held the figures");
}
