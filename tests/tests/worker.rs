//! What the sweeper worker bounds and survives, in clusters with pg_fence in
//! shared_preload_libraries: its database missing, dropped WITH (FORCE) and created again (its
//! launcher waits quietly); and pg_fence.guard_timeout, which ends a guard that holds back a grant,
//! and reports a prepared one.
use pg_fence_integration::{acquire, eventually, sqlstate, Acquire, Cluster, Lease};
use postgres::Client;
use std::thread;
use std::time::{Duration, Instant};

/// How many lines of the server's log contain every one of `parts`.
fn log_lines(cluster: &Cluster, parts: &[&str]) -> usize {
    let log = std::fs::read_to_string(cluster.log_path()).unwrap();
    log.lines().filter(|line| parts.iter().all(|part| line.contains(part))).count()
}

fn sweeper_in(client: &mut Client, database: &str) -> bool {
    let sql =
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_fence sweeper' AND datname = $1";
    client.query_one(sql, &[&database]).unwrap().get::<_, i64>(0) == 1
}

/// pg_fence.database does not exist at first, is created (the worker starts in it and sweeps), is
/// dropped WITH (FORCE) under the worker, and is created again (the worker comes back). While it is
/// missing the launcher says so once, and nothing tries to connect to it: no FATAL every 5 s.
#[test]
fn the_worker_waits_quietly_for_its_database() {
    let cluster = Cluster::start_without_extension(
        "worker_database",
        26550,
        &["shared_preload_libraries=pg_fence", "pg_fence.database=app", "pg_fence.sweep_interval=100ms"],
    );
    let waiting = ["database \"app\" (pg_fence.database) does not exist"];
    let failed = ["FATAL", "database \"app\" does not exist"];
    let said = eventually(Duration::from_secs(20), || log_lines(&cluster, &waiting) >= 1);
    let fatals = log_lines(&cluster, &failed);
    assert!(said && fatals == 0, "waiting said: {said}; FATALs connecting to the missing database: {fatals}");

    let mut admin = cluster.connect();
    admin.batch_execute("CREATE DATABASE app").unwrap();
    let mut app = cluster.connect_to("app");
    app.batch_execute("CREATE EXTENSION pg_fence").unwrap();
    assert!(
        eventually(Duration::from_secs(30), || sweeper_in(&mut admin, "app")),
        "no sweeper worker in the database once created"
    );
    acquire(&mut app, "k", "10 milliseconds").unwrap();
    let unswept = "SELECT count(*) FROM fence.lease_state WHERE token_hash IS NOT NULL";
    assert!(
        eventually(Duration::from_secs(10), || app.query_one(unswept, &[]).unwrap().get::<_, i64>(0) == 0),
        "the worker does not sweep"
    );
    drop(app);

    admin.batch_execute("DROP DATABASE app WITH (FORCE)").unwrap();
    let said_again = eventually(Duration::from_secs(30), || log_lines(&cluster, &waiting) >= 2);
    let fatals = log_lines(&cluster, &failed);
    assert!(
        said_again && fatals == 0,
        "waiting said again after the drop: {said_again}; FATALs connecting to the dropped database: {fatals}"
    );
    assert!(!sweeper_in(&mut admin, "app"));

    admin.batch_execute("CREATE DATABASE app").unwrap();
    assert!(
        eventually(Duration::from_secs(30), || sweeper_in(&mut admin, "app")),
        "the worker did not come back when the database was created again"
    );
}

/// Keeps `client`'s transaction open with a short statement every 100 ms, each well within
/// statement_timeout and idle_in_transaction_session_timeout, until one fails (the error's SQLSTATE,
/// "" when the connection just closed) or 60 s have passed (None).
fn keep_busy(mut client: Client) -> thread::JoinHandle<Option<String>> {
    thread::spawn(move || {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(60) {
            if let Err(err) = client.batch_execute("SELECT 1") {
                return Some(sqlstate(&err));
            }
            thread::sleep(Duration::from_millis(100));
        }
        None
    })
}

/// A cluster with the worker, pg_fence.guard_timeout = 1s and `settings`, a table `orders` of one
/// row; a lease of "k" for 1 s (returned), and a session (returned) that passed its guard and
/// updated the row under it, in a transaction left open, within statement_timeout and
/// idle_in_transaction_session_timeout (5 s each) as long as it runs a statement now and then.
fn guarded_write(name: &str, port: u16, settings: &[&str]) -> (Cluster, Client, Lease, Client) {
    let mut all = vec![
        "shared_preload_libraries=pg_fence",
        "pg_fence.sweep_interval=100ms",
        "pg_fence.guard_timeout=1s",
    ];
    all.extend_from_slice(settings);
    let cluster = Cluster::start(name, port, &all);
    let mut client = cluster.connect();
    client
        .batch_execute(
            "CREATE TABLE orders (id int PRIMARY KEY, note text); INSERT INTO orders VALUES (1, 'new')",
        )
        .unwrap();
    let lease = acquire(&mut client, "k", "1 second").unwrap();
    let mut guard = cluster.connect();
    guard
        .batch_execute("SET statement_timeout = '5s'; SET idle_in_transaction_session_timeout = '5s'; BEGIN")
        .unwrap();
    guard.query_one("SELECT fence.fence_guard('k', $1)", &[&lease.fence]).unwrap();
    guard.batch_execute("UPDATE orders SET note = 'written under the old fence' WHERE id = 1").unwrap();
    (cluster, client, lease, guard)
}

fn note(client: &mut Client) -> String {
    client.query_one("SELECT note FROM orders WHERE id = 1", &[]).unwrap().get(0)
}

/// A guard kept in a transaction that runs short statements, which no PostgreSQL timeout ends,
/// holds back the next grant of its key once the lease has ended. With pg_fence.guard_timeout the
/// worker terminates its backend once a grant has waited that long, even one that waits in short
/// tries; the guarded write rolls back, and the grant goes ahead. A guard on a live lease holds
/// nobody back (its waiters wait for the lease), and is left alone however long it is held.
#[test]
fn a_guard_holding_back_a_grant_past_guard_timeout_is_ended() {
    let (cluster, mut client, lease, mut guard) = guarded_write("guard_timeout", 26551, &[]);
    let guard_pid: i32 = guard.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    let busy = keep_busy(guard);

    let live = acquire(&mut client, "live", "1 hour").unwrap();
    let mut live_guard = cluster.connect();
    live_guard.execute("BEGIN", &[]).unwrap();
    live_guard.query_one("SELECT fence.fence_guard('live', $1)", &[&live.fence]).unwrap();
    let refused = Acquire::new("live", "1 minute").wait("3 seconds").run(&mut client);
    assert!(refused.is_none(), "a live lease was granted again");
    live_guard.batch_execute("COMMIT").expect("a guard of a live lease was ended");

    // The acquirer waits in short tries, as clients with a retry loop do.
    let start = Instant::now();
    let mut granted = None;
    while granted.is_none() && start.elapsed() < Duration::from_secs(30) {
        granted = Acquire::new("k", "1 minute").wait("300 milliseconds").run(&mut client);
    }
    let granted = granted.expect("the grant was still held back by the guard after 30 s");
    assert!(granted.fence > lease.fence);
    let ended = busy.join().unwrap();
    assert!(
        ended.as_deref().is_some_and(|code| code == "57P01" || code.is_empty()),
        "the guard's session: {ended:?}"
    );
    assert_eq!(note(&mut client), "new", "the write under the guard committed");
    assert_eq!(
        log_lines(&cluster, &[&format!("terminating backend {guard_pid}: "), "pg_fence.guard_timeout"]),
        1
    );
}

/// A prepared transaction that holds a guard keeps it across disconnection: the worker does not
/// roll it back (its transaction manager may have committed the other branches), but reports it
/// once, by gid; the query of docs/operations.md finds it; and once it is rolled back the grant
/// goes ahead, without its write.
#[test]
fn a_prepared_guard_past_guard_timeout_is_reported_not_rolled_back() {
    let (cluster, mut client, lease, mut guard) =
        guarded_write("prepared_guard", 26552, &["max_prepared_transactions=2"]);
    guard.batch_execute("PREPARE TRANSACTION 'xa-guard-1'").unwrap();
    drop(guard);

    let mut waiter = cluster.connect();
    let waiting = thread::spawn(move || Acquire::new("k", "1 minute").wait("60 seconds").run(&mut waiter));
    let reported = ["WARNING", "prepared transaction \"xa-guard-1\"", "pg_fence.guard_timeout"];
    assert!(
        eventually(Duration::from_secs(30), || log_lines(&cluster, &reported) >= 1),
        "no warning naming the prepared transaction"
    );
    let found: Vec<String> = client
        .query(
            "SELECT p.gid FROM pg_prepared_xacts p
               JOIN pg_locks x ON x.locktype = 'transactionid' AND x.transactionid = p.transaction AND x.pid IS NULL
               JOIN pg_locks l ON l.virtualtransaction = x.virtualtransaction AND l.pid IS NULL
              WHERE l.locktype = 'advisory' AND l.objsubid = 28774 AND l.granted",
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(found, ["xa-guard-1"], "the monitoring query of docs/operations.md");
    thread::sleep(Duration::from_secs(2));
    assert!(!waiting.is_finished(), "the grant went ahead while the prepared guard was held");
    assert_eq!(log_lines(&cluster, &reported), 1, "reported more than once");

    client.batch_execute("ROLLBACK PREPARED 'xa-guard-1'").unwrap();
    let granted = waiting.join().unwrap().expect("no grant after ROLLBACK PREPARED");
    assert!(granted.fence > lease.fence);
    assert_eq!(note(&mut client), "new");
}
