//! fence.stats: the counters move exactly as a workload says they should, they are not kept
//! without preload (NULLs, not zeros) or with pg_fence.track_stats off, and any role may read
//! them while only fence_admin may reset them.
use pg_fence_integration::{comes_to_wait_on, sqlstate, Cluster};
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

fn acquire(client: &mut Client, key: &str, extra: &str) -> Option<(i64, Uuid)> {
    let sql = format!("SELECT fence, token FROM fence.lease_acquire($1, '30 s'{extra})");
    let row = client.query_one(&sql, &[&key]).unwrap();
    row.get::<_, Option<i64>>(0).map(|fence| (fence, row.get(1)))
}

#[test]
fn the_counters_move_as_the_workload_says() {
    let cluster = preloaded("stats_moves", 27470);
    let mut c = cluster.connect();
    assert!(c.query_one("SELECT fence.stats_reset()", &[]).unwrap().get::<_, bool>(0));
    assert!(counters(&mut c).iter().all(|(_, value)| *value == 0.0), "reset to zero");

    // 5 durable and 2 fast grants; 3 refused acquires.
    let mut held: Vec<(String, i64, Uuid)> = Vec::new();
    for n in 0..7 {
        let key = format!("k{n}");
        let extra = if n >= 5 { ", durable => false" } else { "" };
        let (fence, token) = acquire(&mut c, &key, extra).unwrap();
        held.push((key, fence, token));
    }
    for n in 0..3 {
        assert!(acquire(&mut c, &format!("k{n}"), "").is_none());
    }
    // 4 renewals; 2 refused as lease lost.
    for (key, _, token) in &held[..4] {
        c.execute("SELECT fence.lease_renew($1, $2, '30 s')", &[key, token]).unwrap();
    }
    for _ in 0..2 {
        let err = c
            .execute("SELECT fence.lease_renew('k0', $1, '30 s')", &[&Uuid::from_u128(rand::random())])
            .unwrap_err();
        assert_eq!(sqlstate(&err), "PF001");
    }
    // 2 guards accepted, 1 refused; a fenced_write refused.
    let (key0, fence0, _) = held[0].clone();
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
    for (key, _, token) in &held[1..4] {
        c.execute("SELECT fence.lease_release($1, $2)", &[key, token]).unwrap();
    }
    c.execute("SELECT fence.lease_release($1, $2)", &[&held[1].0, &held[1].2]).unwrap();
    c.execute("SELECT fence.lease_revoke('k4')", &[]).unwrap();
    // Waits: one that runs out, one granted when the holder releases.
    assert!(acquire(&mut c, "k0", ", wait => '200 ms'").is_none());
    let port = cluster.port();
    let waiter = thread::spawn(move || {
        let mut w = Client::connect(
            &format!("host=127.0.0.1 port={port} user=postgres dbname=postgres"),
            postgres::NoTls,
        )
        .unwrap();
        acquire(&mut w, "k0", ", wait => '30 s'").is_some()
    });
    let mut observer = cluster.connect();
    let waiter_pid: i32 = eventually_waiting_pid(&mut observer);
    assert!(comes_to_wait_on(&mut observer, waiter_pid, "Extension"));
    c.execute("SELECT fence.lease_release($1, $2)", &[&held[0].0, &held[0].2]).unwrap();
    assert!(waiter.join().unwrap(), "the waiter got the key");
    // A session-bound lease whose session ends; an expired lease the sweep ends.
    let mut bound = cluster.connect();
    assert!(acquire(&mut bound, "bound", ", session_bound => true").is_some());
    drop(bound);
    let mut expiring = cluster.connect();
    expiring.execute("SELECT fence.lease_acquire('expiring', '1 ms')", &[]).unwrap();
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

/// The pid of the session waiting in lease_acquire.
fn eventually_waiting_pid(observer: &mut Client) -> i32 {
    let mut pid = None;
    assert!(pg_fence_integration::eventually(Duration::from_secs(20), || {
        pid = observer
            .query_opt("SELECT pid FROM pg_stat_activity WHERE query LIKE '%wait => ''30 s''%' AND pid <> pg_backend_pid()", &[])
            .unwrap()
            .map(|row| row.get(0));
        pid.is_some()
    }));
    pid.unwrap()
}

#[test]
fn without_preload_or_with_tracking_off_nothing_is_counted() {
    let plain = Cluster::start("stats_plain", 27471, &[]);
    let mut c = plain.connect();
    acquire(&mut c, "k", "").unwrap();
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
    acquire(&mut c, "k", "").unwrap();
    let row = c.query_one("SELECT available, grants_durable FROM fence.stats", &[]).unwrap();
    assert_eq!((row.get::<_, bool>(0), row.get::<_, Option<i64>>(1)), (true, Some(0)));
}

#[test]
fn any_role_reads_them_and_only_fence_admin_resets_them() {
    let cluster = preloaded("stats_roles", 27473);
    let mut c = cluster.connect();
    c.batch_execute("CREATE ROLE watcher LOGIN; CREATE ROLE operator LOGIN IN ROLE fence_admin; CREATE ROLE app LOGIN IN ROLE fence_user")
        .unwrap();
    acquire(&mut c, "k", "").unwrap();
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
    acquire(&mut c, "k", "").unwrap();
    let row = c.query_one(query, &[]).unwrap();
    let columns: Vec<&str> = row.columns().iter().map(|col| col.name()).collect();
    assert_eq!(columns, metrics);
    assert_eq!(row.get::<_, i64>("grants_durable"), 1);
    let plain = Cluster::start("stats_exporter_plain", 27475, &[]);
    assert!(plain.connect().query(query, &[]).unwrap().is_empty(), "no row without preload");
}
