//! pg_dump / pg_restore of a database that uses pg_fence, into a new database: fences continue above
//! the old values and live leases are kept (fence.lease_state is registered with
//! pg_extension_config_dump, so its rows are in the dump).
use pg_fence_integration::{sqlstate, Cluster};
use std::process::Command;
use uuid::Uuid;

fn run(program: &str, args: &[&str]) {
    let out = Command::new(format!("/usr/lib/postgresql/15/bin/{program}")).args(args).output().unwrap();
    assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_restored_database_continues_fences_and_keeps_live_leases() {
    let cluster = Cluster::start_without_extension("dump", 26911, &[]);
    let mut admin = cluster.connect();
    admin.batch_execute("CREATE DATABASE app").unwrap();
    let mut app = cluster.connect_to("app");
    app.batch_execute(
        "CREATE EXTENSION pg_fence;
         CREATE TABLE invoice (id int PRIMARY KEY, status text, last_fence bigint);
         INSERT INTO invoice VALUES (1, 'open', 0);",
    )
    .unwrap();
    // 'busy' is granted five times, the last one still live; 'idle' three times, all released.
    let mut live = Uuid::nil();
    for (key, grants) in [("busy", 5), ("idle", 3)] {
        for i in 1..=grants {
            let row =
                app.query_one("SELECT fence, token FROM fence.lease_acquire($1, '1 hour')", &[&key]).unwrap();
            let (fence, token): (i64, Uuid) = (row.get(0), row.get(1));
            assert_eq!(fence, i);
            if key == "busy" && i == grants {
                live = token;
            } else {
                app.query_one("SELECT fence.lease_release($1, $2)", &[&key, &token]).unwrap();
            }
        }
    }
    app.query_one(
        "SELECT fence.fenced_write('invoice', 'last_fence', 5, '{\"status\": \"paid\"}', '{\"id\": 1}')",
        &[],
    )
    .unwrap();

    let dump = format!("/tmp/pg_fence_test/dump-{}.custom", std::process::id());
    let port = cluster.port().to_string();
    let connection = ["-h", "127.0.0.1", "-p", &port, "-U", "postgres"];
    run("pg_dump", &[&connection[..], &["-Fc", "-f", &dump, "app"]].concat());
    admin.batch_execute("CREATE DATABASE restored").unwrap();
    run("pg_restore", &[&connection[..], &["-d", "restored", &dump]].concat());
    std::fs::remove_file(&dump).unwrap();

    let mut restored = cluster.connect_to("restored");
    let fences: Vec<(String, i64, bool)> = restored
        .query("SELECT key, fence, live FROM fence.leases ORDER BY key", &[])
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect();
    assert_eq!(fences, vec![("busy".into(), 5, true), ("idle".into(), 3, false)]);

    // The live lease is still held, by the same token; the other key continues above its fence.
    let held: Option<i64> =
        restored.query_one("SELECT (fence.lease_acquire('busy', '1 hour')).fence", &[]).unwrap().get(0);
    assert_eq!(held, None, "the restored database lost a live lease");
    restored.query_one("SELECT fence.lease_renew('busy', $1, '1 hour')", &[&live]).unwrap();
    let next: Option<i64> =
        restored.query_one("SELECT (fence.lease_acquire('idle', '1 hour')).fence", &[]).unwrap().get(0);
    assert_eq!(next, Some(4), "the restored database did not continue the fence");

    // The fenced resource came along too, and still refuses a stale fence.
    let err = restored
        .query_one(
            "SELECT fence.fenced_write('invoice', 'last_fence', 4, '{\"status\": \"void\"}', '{\"id\": 1}')",
            &[],
        )
        .unwrap_err();
    assert_eq!(sqlstate(&err), "PF002");
    let err = restored.query_one("SELECT fence.fence_guard('idle', 3)", &[]).unwrap_err();
    assert_eq!(sqlstate(&err), "PF002");
}
