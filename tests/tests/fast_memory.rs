//! Fast leases in shared memory (pg_fence preloaded, pg_fence.fast_leases > 0; src/leases/memory):
//! a pair takes no transaction id and writes no WAL; every call still takes part in the caller's
//! transaction (a rollback, a rollback to a savepoint undo it; PREPARE TRANSACTION is refused);
//! other sessions see the last committed state meanwhile; a full table refuses a grant with 53400
//! and changes nothing; DROP and CREATE EXTENSION leave no lease behind. The rest of fast leases'
//! behaviour is checked by the other suites run with PG_FENCE_TEST_SETTINGS (pg_test/run-tests).
use pg_fence_integration::{acquire, sqlstate, Acquire, Cluster, Lease};
use postgres::Client;

fn in_memory(name: &str, port: u16, capacity: u32) -> Cluster {
    let capacity = format!("pg_fence.fast_leases={capacity}");
    Cluster::start(
        name,
        port,
        &["shared_preload_libraries=pg_fence", &capacity, "max_prepared_transactions=5"],
    )
}

fn fast(key: &str) -> Acquire<'_> {
    Acquire::new(key, "1 minute").durable(false)
}

fn wal_lsn(client: &mut Client) -> String {
    client.query_one("SELECT pg_current_wal_insert_lsn()::text", &[]).unwrap().get(0)
}

/// (fence, live) of the key's latest grant in fence.leases, as this session sees it.
fn listed(client: &mut Client, key: &str) -> Option<(i64, bool)> {
    client
        .query_opt("SELECT fence, live FROM fence.leases WHERE key = $1 ORDER BY fence DESC LIMIT 1", &[&key])
        .unwrap()
        .map(|row| (row.get(0), row.get(1)))
}

/// After the first grant (which may raise the fast reservation), pairs assign no transaction id
/// and write no WAL at all.
#[test]
fn a_pair_takes_no_transaction_id_and_writes_no_wal() {
    let cluster = in_memory("mem_nowal", 27670, 1000);
    let mut client = cluster.connect();
    let first = fast("warm").run(&mut client).unwrap();
    assert!(first.release(&mut client));
    let before = wal_lsn(&mut client);
    for i in 0..50 {
        let key = format!("k{}", i % 5);
        client.batch_execute("BEGIN").unwrap();
        let lease = fast(&key).run(&mut client).expect("free");
        let xid: Option<String> =
            client.query_one("SELECT txid_current_if_assigned()::text", &[]).unwrap().get(0);
        assert_eq!(xid, None, "a fast grant took a transaction id");
        assert!(lease.release(&mut client));
        client.batch_execute("COMMIT").unwrap();
    }
    assert_eq!(wal_lsn(&mut client), before, "fast pairs wrote WAL");
}

/// A grant, a renewal or a release rolled back (the transaction, or to a savepoint) is undone; an
/// error in a PL/pgSQL EXCEPTION block undoes what the block did.
#[test]
fn a_rollback_undoes_every_call() {
    let cluster = in_memory("mem_rollback", 27671, 1000);
    let mut client = cluster.connect();
    client.batch_execute("BEGIN").unwrap();
    fast("a").run(&mut client).expect("free");
    client.batch_execute("ROLLBACK").unwrap();
    assert_eq!(listed(&mut client, "a"), None, "a grant outlived its rollback");

    client.batch_execute("BEGIN; SAVEPOINT s").unwrap();
    let undone = fast("a").run(&mut client).expect("free");
    client.batch_execute("ROLLBACK TO SAVEPOINT s").unwrap();
    let kept = fast("a").run(&mut client).expect("the savepoint's grant was not undone");
    client.batch_execute("COMMIT").unwrap();
    assert!(kept.fence > 0 && listed(&mut client, "a") == Some((kept.fence, true)));
    assert!(undone.renew(&mut client, "1 minute").is_err(), "a rolled-back grant's token holds the key");

    client.batch_execute("BEGIN; SAVEPOINT s").unwrap();
    assert!(kept.release(&mut client));
    client.batch_execute("ROLLBACK TO SAVEPOINT s; COMMIT").unwrap();
    kept.renew(&mut client, "1 minute").expect("a rolled-back release ended the lease");

    client
        .batch_execute(&format!(
            "DO $$ BEGIN PERFORM fence.lease_release('a', '{}'); RAISE EXCEPTION 'undo'; \
             EXCEPTION WHEN raise_exception THEN NULL; END $$",
            kept.token
        ))
        .unwrap();
    kept.renew(&mut client, "1 minute").expect("a release in a failed block ended the lease");
    assert!(kept.release(&mut client));
    assert_eq!(listed(&mut client, "a").map(|(_, live)| live), Some(false));
}

/// Until the granting transaction commits, another session sees the key as it was committed:
/// fence.leases and current_fence show the old state, and an acquire without wait is refused (the
/// key is being changed); after the commit, both see the grant.
#[test]
fn others_see_the_last_committed_state() {
    let cluster = in_memory("mem_visibility", 27672, 1000);
    let (mut granting, mut other) = (cluster.connect(), cluster.connect());
    let old = fast("v").run(&mut granting).unwrap();
    assert!(old.release(&mut granting));
    granting.batch_execute("BEGIN").unwrap();
    let lease = fast("v").run(&mut granting).unwrap();
    assert_eq!(
        listed(&mut other, "v"),
        Some((old.fence, false)),
        "another session saw the uncommitted grant"
    );
    let current: Option<i64> = other.query_one("SELECT fence.current_fence('v')", &[]).unwrap().get(0);
    assert_eq!(current, Some(old.fence));
    assert!(fast("v").run(&mut other).is_none(), "granted a key another transaction was granting");
    granting.batch_execute("COMMIT").unwrap();
    assert_eq!(listed(&mut other, "v"), Some((lease.fence, true)));
    assert!(fast("v").run(&mut other).is_none(), "granted a held key");
}

/// PREPARE TRANSACTION after any change to a fast lease is refused (0A000) and the transaction
/// rolls back: the change is undone.
#[test]
fn prepare_is_refused_and_undoes_the_change() {
    let cluster = in_memory("mem_prepare", 27673, 1000);
    let mut client2 = cluster.connect();
    let held = fast("p").run(&mut client2).unwrap();
    for change in ["acquire", "release"] {
        client2.batch_execute("BEGIN").unwrap();
        match change {
            "acquire" => drop(fast("q").run(&mut client2).unwrap()),
            _ => assert!(held.release(&mut client2)),
        }
        let err = client2.batch_execute("PREPARE TRANSACTION 'x'").unwrap_err();
        assert_eq!(sqlstate(&err), "0A000", "{change}: {err}");
    }
    assert_eq!(listed(&mut client2, "q"), None, "the prepared grant was kept");
    held.renew(&mut client2, "1 minute").expect("the prepared release was kept");
}

/// With every row in use, a grant of another key fails with 53400 and leaves nothing; keys
/// already in the table are granted again; once the sweep removes ended rows, there is room.
#[test]
fn a_full_table_refuses_and_changes_nothing() {
    let cluster = in_memory("mem_full", 27674, 3);
    let mut client = cluster.connect();
    for key in ["f1", "f2", "f3"] {
        let lease = fast(key).run(&mut client).unwrap();
        assert!(lease.release(&mut client));
    }
    let err = fast("f4").try_run(&mut client).unwrap_err();
    assert_eq!(sqlstate(&err), "53400", "{err}");
    assert_eq!(listed(&mut client, "f4"), None);
    assert!(fast("f1").run(&mut client).is_some(), "a key already in the table was refused");
    client.batch_execute("SET pg_fence.retain_ended = 0").unwrap();
    client.query("SELECT fence.sweep()", &[]).unwrap();
    assert!(fast("f4").run(&mut client).is_some(), "no room after the sweep");
}

/// DROP and CREATE EXTENSION: the new extension sees none of the old one's fast leases, and its
/// first grant of a key is above the old fences (the clock).
#[test]
fn drop_and_create_extension_leave_no_fast_lease() {
    let cluster = in_memory("mem_recreate", 27675, 1000);
    let mut client = cluster.connect();
    let old = acquire(&mut client, "d", "1 hour").map(|_| ()).and(fast("e").run(&mut client)).unwrap();
    client.batch_execute("DROP EXTENSION pg_fence; CREATE EXTENSION pg_fence").unwrap();
    assert_eq!(listed(&mut client, "e"), None, "a fast lease outlived DROP EXTENSION");
    let new = fast("e").run(&mut client).expect("the old extension's lease still holds the key");
    assert!(new.fence > old.fence, "fence {} after {}", new.fence, old.fence);
}

/// The rows of a dropped database are no one's: a sweep in any other database frees them, so they
/// do not keep the cluster's other databases from fast leases.
#[test]
fn a_dropped_databases_rows_are_freed_by_a_sweep_elsewhere() {
    let cluster = in_memory("mem_dropped", 27676, 20);
    let mut client = cluster.connect();
    client.batch_execute("CREATE DATABASE other").unwrap();
    let mut other = cluster.connect_to("other");
    other.batch_execute("CREATE EXTENSION pg_fence").unwrap();
    for i in 0..15 {
        fast(&format!("o{i}")).run(&mut other).unwrap();
    }
    drop(other);
    client.batch_execute("DROP DATABASE other WITH (FORCE)").unwrap();
    client.query("SELECT fence.sweep()", &[]).unwrap();
    for i in 0..15 {
        let key = format!("p{i}");
        fast(&key).try_run(&mut client).unwrap_or_else(|err| panic!("{key}: {err}"));
    }
}

/// A fast lease's renewal and release find it in shared memory and read no index of the durable
/// table (its scans, as the statistics count them, do not move), as a durable lease's do.
#[test]
fn renew_and_release_of_a_fast_lease_read_no_durable_index() {
    let cluster = in_memory("mem_no_index", 27677, 1000);
    let mut client = cluster.connect();
    let durable_index_scans = |client: &mut Client| -> i64 {
        // The counts of this session's earlier statements are flushed when it goes idle.
        client.batch_execute("SELECT pg_stat_force_next_flush()").unwrap();
        let sql = "SELECT coalesce(sum(idx_scan), 0)::bigint FROM pg_stat_user_indexes
                    WHERE schemaname = 'fence' AND relname = 'lease_state'";
        client.query_one(sql, &[]).unwrap().get(0)
    };
    let scans_of = |lease: &Lease, client: &mut Client| {
        let before = durable_index_scans(client);
        lease.renew(client, "2 minutes").unwrap();
        assert!(lease.release(client));
        durable_index_scans(client) - before
    };
    let durable = Acquire::new("d", "1 minute").run(&mut client).unwrap();
    assert!(scans_of(&durable, &mut client) > 0, "a durable lease's calls were not counted");
    let lease = fast("f").run(&mut client).unwrap();
    assert_eq!(scans_of(&lease, &mut client), 0, "a fast lease's renewal or release read the durable index");
}
