//! fence.stats: the counters move exactly as a workload says they should, they are not kept
//! without preload (NULLs, not zeros) or with pg_fence.track_stats off, and any role may read
//! them while only fence_admin may reset them.
use pg_fence_integration::{acquire, backend_pid, comes_to_wait_on, sqlstate, Acquire, Cluster, Lease};
use postgres::Client;
use std::thread;
use std::time::Duration;
use uuid::Uuid;

/// Preloaded, its worker idle (the test sweeps by hand, so that it knows what was swept).
fn preloaded(name: &str, port: u16) -> Cluster {
    Cluster::start(name, port, &["shared_preload_libraries=pg_fence", "pg_fence.sweep_interval=1h"])
}

const COUNTERS: [&str; 17] = [
    "grants_durable",
    "grants_fast",
    "acquires_refused",
    "renewals",
    "renewals_lost",
    "releases",
    "releases_stale",
    "expiries_swept",
    "revocations",
    "session_ends",
    "waits_begun",
    "waits_granted",
    "waits_timed_out",
    "guards_accepted",
    "guards_refused",
    "wait_time_total_ms",
    "wait_time_max_ms",
];

fn counters(client: &mut Client) -> Vec<(String, f64)> {
    let columns = COUNTERS.map(|c| format!("{c}::float8")).join(", ");
    let row = client.query_one(&format!("SELECT {columns} FROM fence.stats"), &[]).unwrap();
    COUNTERS.iter().enumerate().map(|(i, name)| (name.to_string(), row.get::<_, f64>(i))).collect()
}

#[test]
fn the_counters_move_as_the_workload_says() {
    let cluster = preloaded("stats_moves", 27470);
    let mut c = cluster.connect();
    assert!(c.query_one("SELECT fence.stats_reset()", &[]).unwrap().get::<_, bool>(0));
    assert!(counters(&mut c).iter().all(|(_, value)| *value == 0.0), "reset to zero");

    // 5 durable and 2 fast grants; 3 refused acquires.
    let mut held: Vec<Lease> = Vec::new();
    for n in 0..7 {
        let key = format!("k{n}");
        let grant = Acquire::new(&key, "30 s");
        let grant = if n >= 5 { grant.durable(false) } else { grant };
        held.push(grant.run(&mut c).unwrap());
    }
    for n in 0..3 {
        assert!(acquire(&mut c, &format!("k{n}"), "30 s").is_none());
    }
    // 4 renewals; 2 refused as lease lost.
    for lease in &held[..4] {
        lease.renew(&mut c, "30 s").unwrap();
    }
    for _ in 0..2 {
        let err = c
            .execute("SELECT fence.lease_renew('k0', $1, '30 s')", &[&Uuid::from_u128(rand::random())])
            .unwrap_err();
        assert_eq!(sqlstate(&err), "PF001");
    }
    // 2 guards accepted, 1 refused; a fenced_write refused.
    let (key0, fence0) = (held[0].key.clone(), held[0].fence);
    for _ in 0..2 {
        c.execute("SELECT fence.fence_guard($1, $2)", &[&key0, &fence0]).unwrap();
    }
    let err = c.execute("SELECT fence.fence_guard($1, $2)", &[&key0, &(fence0 - 1)]).unwrap_err();
    assert_eq!(sqlstate(&err), "PF002");
    c.batch_execute(
        "CREATE TABLE t (id int PRIMARY KEY, fence bigint, v int); INSERT INTO t VALUES (1, 100, 0)",
    )
    .unwrap();
    let err = c
        .execute("SELECT fence.fenced_write('t', 'fence', 99, '{\"v\": 1}', '{\"id\": 1}')", &[])
        .unwrap_err();
    assert_eq!(sqlstate(&err), "PF002");
    // 3 releases, 1 stale (a second release of the same lease); 1 revocation.
    for lease in &held[1..4] {
        lease.release(&mut c);
    }
    held[1].release(&mut c);
    c.execute("SELECT fence.lease_revoke('k4')", &[]).unwrap();
    // Waits: one that runs out, one granted when the holder releases.
    assert!(Acquire::new("k0", "30 s").wait("200 ms").run(&mut c).is_none());
    let mut w = cluster.connect();
    let waiter_pid = backend_pid(&mut w);
    let waiter = thread::spawn(move || Acquire::new("k0", "30 s").wait("30 s").run(&mut w).is_some());
    let mut observer = cluster.connect();
    assert!(comes_to_wait_on(&mut observer, waiter_pid, "Extension"));
    held[0].release(&mut c);
    assert!(waiter.join().unwrap(), "the waiter got the key");
    // A session-bound lease whose session ends; an expired lease the sweep ends.
    let mut bound = cluster.connect();
    assert!(Acquire::new("bound", "30 s").session_bound(true).run(&mut bound).is_some());
    drop(bound);
    let mut expiring = cluster.connect();
    acquire(&mut expiring, "expiring", "1 ms");
    thread::sleep(Duration::from_millis(50));
    let swept =
        |c: &mut Client| c.query_one("SELECT expiries_swept FROM fence.stats", &[]).unwrap().get::<_, i64>(0);
    assert!(pg_fence_integration::eventually(Duration::from_secs(20), || {
        let mut c = cluster.connect();
        c.execute("SELECT fence.sweep()", &[]).unwrap();
        swept(&mut c) >= 2 // the expired lease, and the session-bound one whose session ended
    }));

    let got = counters(&mut c);
    let value = |name: &str| got.iter().find(|(n, _)| n == name).unwrap().1;
    let expected = [
        ("grants_durable", 5.0 + 1.0 + 1.0 + 1.0), // k0..k4, the waiter's, bound, expiring
        ("grants_fast", 2.0),
        ("acquires_refused", 3.0 + 1.0), // and the wait that ran out
        ("renewals", 4.0),
        ("renewals_lost", 2.0),
        ("releases", 4.0),
        ("releases_stale", 1.0),
        ("expiries_swept", 2.0),
        ("revocations", 1.0),
        ("session_ends", 1.0),
        ("waits_begun", 2.0),
        ("waits_granted", 1.0),
        ("waits_timed_out", 1.0),
        ("guards_accepted", 2.0),
        ("guards_refused", 2.0),
    ];
    for (name, want) in expected {
        assert_eq!(value(name), want, "{name}: {got:?}");
    }
    assert!(value("wait_time_total_ms") >= 200.0 && value("wait_time_max_ms") >= 200.0, "{got:?}");
    assert!(value("wait_time_max_ms") <= value("wait_time_total_ms"));
}

#[test]
fn without_preload_or_with_tracking_off_nothing_is_counted() {
    let plain = Cluster::start("stats_plain", 27471, &[]);
    let mut c = plain.connect();
    acquire(&mut c, "k", "30 s").unwrap();
    let row = c.query_one("SELECT available, since, grants_durable FROM fence.stats", &[]).unwrap();
    assert_eq!((row.get::<_, bool>(0), row.get::<_, Option<i64>>(2)), (false, None), "NULLs, not zeros");
    assert!(!c.query_one("SELECT fence.stats_reset()", &[]).unwrap().get::<_, bool>(0));

    let off = preloaded("stats_off", 27472);
    let mut c = off.connect();
    c.batch_execute("ALTER SYSTEM SET pg_fence.track_stats = off").unwrap();
    c.batch_execute("SELECT pg_reload_conf()").unwrap();
    let show = |c: &mut Client| c.query_one("SHOW pg_fence.track_stats", &[]).unwrap().get::<_, String>(0);
    assert!(pg_fence_integration::eventually(Duration::from_secs(20), || show(&mut off.connect()) == "off"));
    let mut c = off.connect();
    acquire(&mut c, "k", "30 s").unwrap();
    let row = c.query_one("SELECT available, grants_durable FROM fence.stats", &[]).unwrap();
    assert_eq!((row.get::<_, bool>(0), row.get::<_, Option<i64>>(1)), (true, Some(0)));
}

#[test]
fn any_role_reads_them_and_only_fence_admin_resets_them() {
    let cluster = preloaded("stats_roles", 27473);
    let mut c = cluster.connect();
    c.batch_execute("CREATE ROLE watcher LOGIN; CREATE ROLE operator LOGIN IN ROLE fence_admin; CREATE ROLE app LOGIN IN ROLE fence_user")
        .unwrap();
    acquire(&mut c, "k", "30 s").unwrap();
    let mut watcher = cluster.connect_as("watcher");
    let grants: i64 = watcher.query_one("SELECT grants_durable FROM fence.stats", &[]).unwrap().get(0);
    assert_eq!(grants, 1);
    for role in ["watcher", "app"] {
        let err = cluster.connect_as(role).execute("SELECT fence.stats_reset()", &[]).unwrap_err();
        assert_eq!(sqlstate(&err), "42501", "{role}");
    }
    assert!(cluster
        .connect_as("operator")
        .query_one("SELECT fence.stats_reset()", &[])
        .unwrap()
        .get::<_, bool>(0));
    let grants: i64 = watcher.query_one("SELECT grants_durable FROM fence.stats", &[]).unwrap().get(0);
    assert_eq!(grants, 0);
}

/// docs/monitoring/postgres_exporter.yml: its query runs, and names exactly the metrics it lists.
#[test]
fn the_exporter_query_runs_and_lists_every_column_it_returns() {
    let file = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/monitoring/postgres_exporter.yml"
    ))
    .unwrap();
    let query = file.lines().find_map(|l| l.trim().strip_prefix("query: ")).unwrap().trim_matches('"');
    let metrics: Vec<&str> =
        file.lines().filter_map(|l| l.trim().strip_prefix("- ").and_then(|m| m.strip_suffix(':'))).collect();
    let cluster = preloaded("stats_exporter", 27474);
    let mut c = cluster.connect();
    acquire(&mut c, "k", "30 s").unwrap();
    let row = c.query_one(query, &[]).unwrap();
    let columns: Vec<&str> = row.columns().iter().map(|col| col.name()).collect();
    assert_eq!(columns, metrics);
    assert_eq!(row.get::<_, i64>("grants_durable"), 1);
    let plain = Cluster::start("stats_exporter_plain", 27475, &[]);
    assert!(plain.connect().query(query, &[]).unwrap().is_empty(), "no row without preload");
}

/// session_ends counts the session-bound leases a session still held when it exited, and no other:
/// not one it released, rolled back, let expire or saw revoked. waits_begun counts acquires that
/// began to wait, not an acquire with `wait` of a free key.
#[test]
fn session_ends_and_waits_begun_count_only_what_they_name() {
    let cluster = preloaded("stats_exact", 27476);
    let mut c = cluster.connect();
    assert!(c.query_one("SELECT fence.stats_reset()", &[]).unwrap().get::<_, bool>(0));
    let mut session = cluster.connect();
    fn bound<'a>(key: &'a str, ttl: &'a str) -> Acquire<'a> {
        Acquire::new(key, ttl).session_bound(true)
    }
    let released = bound("released", "30 s").run(&mut session).unwrap();
    assert!(released.release(&mut session));
    let mut tx = session.transaction().unwrap();
    bound("rolled-back", "30 s").run(&mut tx).unwrap();
    tx.rollback().unwrap();
    bound("expired", "1 ms").run(&mut session).unwrap();
    bound("revoked", "30 s").run(&mut session).unwrap();
    assert!(c.query_one("SELECT fence.lease_revoke('revoked')", &[]).unwrap().get::<_, bool>(0));
    bound("held", "30 s").run(&mut session).unwrap();
    thread::sleep(Duration::from_millis(50));
    drop(session);
    let ends =
        |c: &mut Client| c.query_one("SELECT session_ends FROM fence.stats", &[]).unwrap().get::<_, i64>(0);
    assert!(pg_fence_integration::eventually(Duration::from_secs(20), || ends(&mut c) > 0), "no session end");
    thread::sleep(Duration::from_millis(300));
    assert_eq!(ends(&mut c), 1, "only the held lease's session ended it");

    Acquire::new("free", "30 s").wait("5 s").run(&mut c).expect("the key is free");
    let begun: i64 = c.query_one("SELECT waits_begun FROM fence.stats", &[]).unwrap().get(0);
    assert_eq!(begun, 0, "an acquire of a free key began to wait");
}
