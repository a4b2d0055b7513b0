//! pg_dump / pg_restore of a database that uses pg_fence (custom format, with the pg_dump and
//! pg_restore of the build under test, see `pg_bin`). fence.lease_state is registered with
//! pg_extension_config_dump, so its rows are in the dump: a restore keeps live leases and continues
//! each key's fences above the ones the dump holds.
//!
//! A dump is also an older history: grants made after it are not in it, and their holders still
//! hold those fences when it is restored, into a new database or in place (`pg_restore --clean`).
//! The restored database must hand none of them out again.
use pg_fence_integration::{acquire, next_history, run_pg_program, sqlstate, Cluster, Lease};
use postgres::Client;

/// Dumps database `db` of `cluster` to a fresh custom-format file, whose path it returns.
fn dump(cluster: &Cluster, db: &str) -> String {
    let file = std::env::temp_dir().join(format!(
        "pg_fence-dump-{}-{db}-{}.custom",
        std::process::id(),
        cluster.port()
    ));
    let file = file.to_str().unwrap().to_string();
    let port = cluster.port().to_string();
    run_pg_program("pg_dump", &["-h", "127.0.0.1", "-p", &port, "-U", "postgres", "-Fc", "-f", &file, db]);
    file
}

/// pg_restore of `file` into database `db` of `cluster`, with `options` such as "--clean".
fn restore(cluster: &Cluster, db: &str, file: &str, options: &[&str]) {
    let port = cluster.port().to_string();
    let connection = ["-h", "127.0.0.1", "-p", &port, "-U", "postgres", "--exit-on-error", "-d", db];
    run_pg_program("pg_restore", &[&connection[..], options, &[file]].concat());
}

#[test]
fn a_restored_database_continues_fences_and_keeps_live_leases() {
    let cluster = Cluster::start_without_extension("dump", 27331, &[]);
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
    let (mut busy, mut idle) = (Vec::new(), Vec::new());
    let mut live: Option<Lease> = None;
    for (key, grants) in [("busy", 5), ("idle", 3)] {
        for i in 1..=grants {
            let lease = acquire(&mut app, key, "1 hour").unwrap_or_else(|| panic!("{key} is held"));
            let fence = lease.fence;
            let fences = if key == "busy" { &mut busy } else { &mut idle };
            assert!(fences.last().is_none_or(|last| fence > *last), "{key}: {fence} after {fences:?}");
            fences.push(fence);
            if key == "busy" && i == grants {
                live = Some(lease);
            } else {
                lease.release(&mut app);
            }
        }
    }
    let (busy_fence, idle_fence) = (*busy.last().unwrap(), *idle.last().unwrap());
    app.query_one(
        "SELECT fence.fenced_write('invoice', 'last_fence', $1, '{\"status\": \"paid\"}', '{\"id\": 1}')",
        &[&busy_fence],
    )
    .unwrap();

    let file = dump(&cluster, "app");
    admin.batch_execute("CREATE DATABASE restored").unwrap();
    restore(&cluster, "restored", &file, &[]);
    std::fs::remove_file(&file).unwrap();

    let mut restored = cluster.connect_to("restored");
    let fences: Vec<(String, i64, bool)> = restored
        .query("SELECT key, fence, live FROM fence.leases ORDER BY key", &[])
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect();
    assert_eq!(fences, vec![("busy".into(), busy_fence, true), ("idle".into(), idle_fence, false)]);

    // The live lease is still held, by the same token; the other key continues above its fence.
    let held = acquire(&mut restored, "busy", "1 hour").map(|lease| lease.fence);
    assert_eq!(held, None, "the restored database lost a live lease");
    live.expect("busy's last grant").renew(&mut restored, "1 hour").unwrap();
    let next = acquire(&mut restored, "idle", "1 hour").map(|lease| lease.fence);
    assert!(next.is_some_and(|next| next > idle_fence), "idle: {next:?} after {idle:?}");

    // The fenced resource came along too, and still refuses a stale fence.
    let err = restored
        .query_one(
            "SELECT fence.fenced_write('invoice', 'last_fence', $1, '{\"status\": \"void\"}', '{\"id\": 1}')",
            &[&busy[busy.len() - 2]],
        )
        .unwrap_err();
    assert_eq!(sqlstate(&err), "PF002");
    let err = restored.query_one("SELECT fence.fence_guard('idle', $1)", &[&idle_fence]).unwrap_err();
    assert_eq!(sqlstate(&err), "PF002");
}

/// Grants, a dump, more grants (one of them still held), then the dump restored: into a new
/// database, or over the dumped one with `pg_restore --clean`. The grants after the dump are the
/// ones the restored database forgets.
fn restore_an_older_dump(name: &str, port: u16, in_place: bool) {
    let cluster = Cluster::start_without_extension(name, port, &[]);
    let mut admin = cluster.connect();
    admin.batch_execute("CREATE DATABASE app").unwrap();
    let mut app = cluster.connect_to("app");
    app.batch_execute("CREATE EXTENSION pg_fence").unwrap();
    let mut issued = Vec::new();
    let mut grant = |app: &mut Client, key: &str, release: bool| {
        let lease = acquire(app, key, "1 hour").unwrap_or_else(|| panic!("{key} is held"));
        issued.push((key.to_string(), lease.fence));
        if release {
            lease.release(app);
        }
    };
    for key in ["a", "b", "c", "a", "b", "c"] {
        grant(&mut app, key, true);
    }
    let file = dump(&cluster, "app");
    for key in ["a", "b", "c", "a", "b", "only_after"] {
        grant(&mut app, key, true);
    }
    // Still held, on the current history, when the older one is restored.
    grant(&mut app, "c", false);
    drop(app);
    let forgotten = issued.len() - 6;

    let db = if in_place {
        restore(&cluster, "app", &file, &["--clean"]);
        "app"
    } else {
        admin.batch_execute("CREATE DATABASE restored").unwrap();
        restore(&cluster, "restored", &file, &[]);
        "restored"
    };
    std::fs::remove_file(&file).unwrap();
    let outcome = next_history(&mut cluster.connect_to(db), &issued);
    let how = if in_place { "in place with --clean" } else { "into a new database" };
    println!("an older dump restored {how}: fences {issued:?}, {outcome:?}");
    assert_eq!(
        outcome.forgotten, forgotten,
        "the restore did not forget what followed the dump: {outcome:?}"
    );
    assert_eq!(
        (outcome.reissued, outcome.stale_guards_accepted),
        (0, 0),
        "keys whose next grant reissued a fence, and stale guards accepted: {outcome:?}"
    );
}

#[test]
fn an_older_dump_restored_into_a_new_database_reissues_no_fence() {
    restore_an_older_dump("dump_older", 27332, false);
}

#[test]
fn an_older_dump_restored_in_place_reissues_no_fence() {
    restore_an_older_dump("dump_clean", 27333, true);
}
