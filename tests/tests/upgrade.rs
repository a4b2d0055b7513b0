//! Versions and upgrades: the oldest kept version can be created, holds state, and upgrades to the
//! current one with that state intact; and an upgraded installation is exactly a fresh one, so a
//! schema change without an upgrade script fails here.
use pg_fence_integration::{acquire, backend_pid, comes_to_wait_on, pg_program, sqlstate, Cluster};
use postgres::Client;

/// The versions whose full install scripts are kept in sql/archive, oldest first.
const OLD_VERSIONS: &[&str] = &["0.1.0", "0.2.0", "0.3.0", "0.4.0"];

/// The extension's version, as its Cargo.toml (and so `cargo pgrx install`) says.
fn current_version() -> String {
    let manifest = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml")).unwrap();
    let line = manifest.lines().find(|line| line.starts_with("version = ")).expect("version in Cargo.toml");
    line.trim_start_matches("version = ").trim_matches('"').to_string()
}

/// SQLSTATE and message of a server error, for a panic that must say what failed.
fn db_message(err: &postgres::Error) -> String {
    let message = err.as_db_error().map_or_else(|| err.to_string(), |db| db.message().to_string());
    format!("{} {message}", sqlstate(err))
}

fn version(client: &mut Client) -> String {
    client.query_one("SELECT extversion FROM pg_extension WHERE extname = 'pg_fence'", &[]).unwrap().get(0)
}

/// Grants `key`, which must be free, and checks that its fence is above `old_fence` and is now the
/// key's current one; returns it.
fn grant_above(client: &mut Client, key: &str, old_fence: i64, old: &str) -> i64 {
    let fence = acquire(client, key, "1 hour")
        .unwrap_or_else(|| panic!("{old}: {key} was not granted after the upgrade"))
        .fence;
    assert!(fence > old_fence, "{old}: {key} granted fence {fence} after {old_fence}");
    let current: Option<i64> = client.query_one("SELECT fence.current_fence($1)", &[&key]).unwrap().get(0);
    assert_eq!(current, Some(fence), "{old}: {key}");
    fence
}

#[test]
fn every_kept_version_upgrades_to_the_current_one_with_its_state() {
    let cluster = Cluster::start_without_extension("upgrade", 26901, &[]);
    let mut admin = cluster.connect();
    for old in OLD_VERSIONS {
        let db = format!("from_{}", old.replace('.', "_"));
        admin.batch_execute(&format!("CREATE DATABASE {db}")).unwrap();
        let mut client = cluster.connect_to(&db);
        client.batch_execute(&format!("CREATE EXTENSION pg_fence VERSION '{old}'")).unwrap();
        assert_eq!(version(&mut client), *old);

        // State made by the old version: a released key, a live lease, a versioned table, and a
        // resource that took a fenced write.
        acquire(&mut client, "released", "1 hour").expect("released is free").release(&mut client);
        let live = acquire(&mut client, "live", "1 hour").expect("live is free");
        // The old versions' SQL runs on this build's library, whose grants are already above the
        // clock; the small fences of their per-key counter are set by hand: 'released' as granted
        // three times, 'live' twice.
        client
            .batch_execute("UPDATE fence.lease_state SET fence = CASE key WHEN 'released' THEN 3 ELSE 2 END")
            .unwrap();
        client
            .batch_execute(
                "CREATE TABLE doc (id int PRIMARY KEY, body text, version bigint NOT NULL DEFAULT 1);
                 INSERT INTO doc VALUES (1, 'draft', 1);
                 SELECT fence.enable_versioning('doc');
                 CREATE TABLE res (id int PRIMARY KEY, value text, fence bigint);
                 INSERT INTO res VALUES (1, 'new', NULL);",
            )
            .unwrap();
        // The old versions' fenced and versioned writes keep working on this build's library until
        // the update, without the objects 0.4.0's writes use (fence.fence_not_above and
        // fence.checked_version).
        let written: i64 = client
            .query_one(
                "SELECT fence.fenced_write('res', 'fence', 3, '{\"value\": \"under fence 3\"}', '{\"id\": 1}')",
                &[],
            )
            .unwrap_or_else(|err| panic!("{old}: fenced_write before the update: {}", db_message(&err)))
            .get(0);
        assert_eq!(written, 1);
        let doc_version: i64 = client
            .query_one(
                "SELECT fence.versioned_update('doc', 'version', 1, '{\"body\": \"v2\"}', '{\"id\": 1}')",
                &[],
            )
            .unwrap_or_else(|err| panic!("{old}: versioned_update before the update: {}", db_message(&err)))
            .get(0);
        assert_eq!(doc_version, 2);
        // And so does the sweep (the worker's, in a preloading server), which deletes nothing yet.
        client
            .query_one("SELECT fence.sweep()", &[])
            .unwrap_or_else(|err| panic!("{old}: sweep: {}", db_message(&err)));

        client.batch_execute("ALTER EXTENSION pg_fence UPDATE").unwrap();
        assert_eq!(version(&mut client), current_version());

        // The state is intact: the live lease is still held by its token and its fence, the keys
        // continue above their old fences, versioning still guards the table; and the new
        // function works.
        live.renew(&mut client, "1 hour").unwrap();
        let taken = acquire(&mut client, "live", "1 hour").map(|lease| lease.fence);
        assert_eq!(taken, None, "{old}: the live lease was lost in the upgrade");
        let guarded: bool = client.query_one("SELECT fence.fence_guard('live', 2)", &[]).unwrap().get(0);
        assert!(guarded, "{old}: the live holder's fence no longer passes the guard");
        let next = grant_above(&mut client, "released", 3, old);
        live.release(&mut client);
        grant_above(&mut client, "live", 2, old);
        let err = client.execute("UPDATE doc SET body = 'x', version = 5 WHERE id = 1", &[]).unwrap_err();
        assert_eq!(sqlstate(&err), "40001", "versioning no longer guards the table");
        let waiters: i32 = client.query_one("SELECT fence.waiters('live')", &[]).unwrap().get(0);
        assert_eq!(waiters, 0);

        // The resource still holds the old fence 3: it refuses a writer with an older fence, takes
        // the new grant's, and then refuses fence 3 too.
        let write = |client: &mut Client, fence: i64| {
            let changes = format!(r#"{{"value": "under fence {fence}"}}"#);
            client
                .query_one(
                    "SELECT fence.fenced_write('res', 'fence', $1, $2::text::jsonb, '{\"id\": 1}')",
                    &[&fence, &changes],
                )
                .map(|_| ())
                .map_err(|err| sqlstate(&err))
        };
        let row = |client: &mut Client| -> (String, i64) {
            let row = client.query_one("SELECT value, fence FROM res WHERE id = 1", &[]).unwrap();
            (row.get(0), row.get(1))
        };
        assert_eq!(write(&mut client, 2), Err("PF002".into()), "{old}: a stale writer got through");
        assert_eq!(row(&mut client), ("under fence 3".to_string(), 3));
        assert_eq!(write(&mut client, next), Ok(()), "{old}: the new grant's fence was refused");
        assert_eq!(row(&mut client), (format!("under fence {next}"), next));
        assert_eq!(write(&mut client, 3), Err("PF002".into()), "{old}: the old fence 3 got through");

        client.batch_execute("DROP TABLE doc, res").unwrap(); // compare the extension's objects alone
        let (upgraded, fresh) = (schema(&cluster, &db), fresh_schema(&cluster, &mut admin));
        let only_in = |a: &str, b: &str| {
            a.lines().filter(|l| !b.lines().any(|m| m == *l)).collect::<Vec<_>>().join("\n")
        };
        assert!(
            upgraded == fresh,
            "{old} + upgrade scripts differs from a fresh install.\nOnly after the upgrade:\n{}\nOnly fresh:\n{}",
            only_in(&upgraded, &fresh),
            only_in(&fresh, &upgraded)
        );
    }
}

/// Lines of a --binary-upgrade dump that carry OIDs, transaction ids or a random key.
const OID_LINES: &[&str] =
    &["\\restrict", "\\unrestrict", "UPDATE pg_catalog.pg_class", "SET relfrozenxid", "WHERE oid = "];

/// The extension's objects as pg_dump --binary-upgrade writes them (it lists an extension's member
/// objects, which a plain dump leaves to CREATE EXTENSION), without the lines that name OIDs.
fn schema(cluster: &Cluster, db: &str) -> String {
    let out = pg_program("pg_dump")
        .args(["--binary-upgrade", "--schema-only", "-h", "127.0.0.1", "-U", "postgres", "-d", db])
        .args(["-p", &cluster.port().to_string()])
        .output()
        .expect("run pg_dump");
    assert!(out.status.success(), "pg_dump: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|line| !line.contains("binary_upgrade") && !OID_LINES.iter().any(|oid| line.starts_with(oid)))
        .filter(|line| !line.starts_with("--") && !line.is_empty())
        .map(|line| format!("{line}\n"))
        .collect()
}

fn fresh_schema(cluster: &Cluster, admin: &mut Client) -> String {
    admin.batch_execute("DROP DATABASE IF EXISTS fresh").unwrap();
    admin.batch_execute("CREATE DATABASE fresh").unwrap();
    cluster.connect_to("fresh").batch_execute("CREATE EXTENSION pg_fence").unwrap();
    schema(cluster, "fresh")
}

/// The update from 0.3.0 changes the hash that names key locks. A guard that runs while the update
/// does must not pass holding a lock named by the old hash, which would hold back no grant made
/// after the update. It reads the lease (waiting for the update's lock on fence.lease_state) before
/// it names its lock, so it names it by the new hash: its transaction holds back the next grant.
#[test]
fn a_guard_that_raced_the_update_from_0_3_0_holds_the_new_lock() {
    let cluster = Cluster::start_without_extension("upgrade_race", 26902, &[]);
    let mut holder = cluster.connect();
    holder.batch_execute("CREATE EXTENSION pg_fence VERSION '0.3.0'").unwrap();
    let fence = acquire(&mut holder, "k", "1 hour").expect("k is free").fence;

    let mut updater = cluster.connect();
    updater.batch_execute("BEGIN; ALTER EXTENSION pg_fence UPDATE;").unwrap();
    let mut guard = cluster.connect();
    let pid = backend_pid(&mut guard);
    let guarded = std::thread::spawn(move || {
        let outcome = guard.batch_execute(&format!("BEGIN; SELECT fence.fence_guard('k', {fence})"));
        (outcome.map_err(|e| sqlstate(&e)), guard)
    });
    let mut observer = cluster.connect();
    assert!(comes_to_wait_on(&mut observer, pid, "Lock"), "the guard never waited for the update");
    updater.batch_execute("COMMIT").unwrap();
    let (outcome, mut guard) = guarded.join().unwrap();
    assert_eq!(outcome, Ok(()), "the guard of the live lease was refused");
    observer.query_one("SELECT fence.lease_revoke('k')", &[]).unwrap();
    assert!(acquire(&mut observer, "k", "1 hour").is_none(), "a grant got past the open guard");
    guard.batch_execute("COMMIT").unwrap();
    assert!(
        acquire(&mut observer, "k", "1 hour").is_some(),
        "the key is free once the guard's transaction ended"
    );
}
