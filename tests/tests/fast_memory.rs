//! Fast leases in shared memory (pg_fence preloaded, pg_fence.fast_leases > 0; src/leases/state/memory):
//! a pair takes no transaction id and writes no WAL; every call still takes part in the caller's
//! transaction (a rollback, a rollback to a savepoint undo it; PREPARE TRANSACTION is refused);
//! other sessions see the last committed state meanwhile; a full table refuses a grant with 53400
//! and changes nothing; DROP and CREATE EXTENSION leave no lease behind. The rest of fast leases'
//! behaviour is checked by the other suites run with PG_FENCE_TEST_SETTINGS (pg_test/run-tests).
use pg_fence_integration::{
    acquire, inspect_wal, reserve_fast_fences_for_an_hour, sqlstate, wal_insert_position,
    wal_records_between, Acquire, Cluster, Lease,
};
use postgres::Client;

fn in_memory(name: &str, port: u16, capacity: u32) -> Cluster {
    in_memory_with(name, port, capacity, &[])
}

fn in_memory_with(name: &str, port: u16, capacity: u32, settings: &[&str]) -> Cluster {
    let capacity = format!("pg_fence.fast_leases={capacity}");
    let mut all = vec!["shared_preload_libraries=pg_fence", &capacity, "max_prepared_transactions=5"];
    all.extend_from_slice(settings);
    Cluster::start(name, port, &all)
}

fn fast(key: &str) -> Acquire<'_> {
    Acquire::new(key, "1 minute").durable(false)
}

/// (fence, live) of the key's latest grant in fence.leases, as this session sees it.
fn listed(client: &mut Client, key: &str) -> Option<(i64, bool)> {
    client
        .query_opt("SELECT fence, live FROM fence.leases WHERE key = $1 ORDER BY fence DESC LIMIT 1", &[&key])
        .unwrap()
        .map(|row| (row.get(0), row.get(1)))
}

/// While the fast reservation covers their fences, pairs assign no transaction id and write no WAL
/// at all. (Background processes still may: `wal_records_between` leaves out those of the background
/// writer and the checkpointer, and the sweeper, which writes its statistics every sweep, sleeps.)
#[test]
fn a_pair_takes_no_transaction_id_and_writes_no_wal() {
    let cluster = in_memory_with("mem_nowal", 27670, 1000, &["pg_fence.sweep_interval=1d"]);
    let mut client = cluster.connect();
    inspect_wal(&mut client);
    client.batch_execute("VACUUM").unwrap(); // or reads prune what CREATE EXTENSION left behind
    let first = fast("warm").run(&mut client).unwrap();
    assert!(first.release(&mut client));
    reserve_fast_fences_for_an_hour(&mut client);
    let before = wal_insert_position(&mut client);
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
    let after = wal_insert_position(&mut client);
    let written = wal_records_between(&mut client, &before, &after);
    assert_eq!(written, Vec::<String>::new(), "fast pairs wrote WAL");
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

/// A full table (every row a live lease's) refuses a grant with 53400 and changes nothing; once a
/// lease ends, the next grant frees its row at once (not pg_fence.retain_ended later, nor by the
/// sweep), and the freed key's next grant is still above its old fence.
#[test]
fn a_full_table_refuses_and_changes_nothing_until_a_lease_ends() {
    let cluster = in_memory("mem_full", 27674, 3);
    let mut client = cluster.connect();
    let leases: Vec<Lease> =
        ["f1", "f2", "f3"].iter().map(|key| fast(key).run(&mut client).unwrap()).collect();
    let err = fast("f4").try_run(&mut client).unwrap_err();
    assert_eq!(sqlstate(&err), "53400", "{err}");
    assert!(message(&err).contains("3 in use, 0 reserved"), "{err:?}");
    assert_eq!(listed(&mut client, "f4"), None);
    assert!(leases[0].release(&mut client));
    let f4 = fast("f4").run(&mut client).expect("no room after a lease ended");
    assert!(f4.release(&mut client));
    let again = fast("f1").run(&mut client).expect("no room after a lease ended");
    assert!(again.fence > leases[0].fence, "f1 granted {} after {}", again.fence, leases[0].fence);
}

/// One role cannot take the table, shared by every database, from the others: a role's pairs on
/// ever new keys go on past the table's size (each grant that finds no room frees the role's ended
/// rows), it can hold at most pg_fence.fast_leases_per_role rows, and another role in another
/// database still has room. (With ended rows kept for pg_fence.retain_ended and no limit per role,
/// the first role's pairs filled the table, and every other database's grants failed with 53400.)
#[test]
fn one_role_cannot_take_the_table_from_other_roles_and_databases() {
    let cluster = Cluster::start(
        "mem_roles",
        27679,
        &[
            "shared_preload_libraries=pg_fence",
            "pg_fence.fast_leases=100",
            "pg_fence.fast_leases_per_role=40",
        ],
    );
    let mut admin = cluster.connect();
    admin
        .batch_execute("CREATE ROLE busy LOGIN; CREATE ROLE other LOGIN; GRANT fence_user TO busy, other")
        .unwrap();
    admin.batch_execute("CREATE DATABASE busy OWNER busy").unwrap();
    cluster.connect_to("busy").batch_execute("CREATE EXTENSION pg_fence; GRANT fence_user TO busy").unwrap();
    let mut busy = connect(&cluster, "busy", "busy");
    let mut first = None;
    for i in 0..300 {
        let key = format!("pair-{i}");
        let lease = fast(&key).try_run(&mut busy).unwrap_or_else(|err| panic!("pair {i}: {err}")).unwrap();
        first.get_or_insert(lease.fence);
        assert!(lease.release(&mut busy));
    }
    let held: Vec<Lease> = (0..40).map(|i| fast(&format!("held-{i}")).run(&mut busy).unwrap()).collect();
    let err = fast("one-more").try_run(&mut busy).unwrap_err();
    assert_eq!(sqlstate(&err), "53400", "{err}");
    assert!(message(&err).contains("pg_fence.fast_leases_per_role"), "{err:?}");
    let mut other = connect(&cluster, "postgres", "other");
    for i in 0..40 {
        fast(&format!("other-{i}"))
            .try_run(&mut other)
            .unwrap_or_else(|err| panic!("other {i}: {err}"))
            .unwrap();
    }
    // A lease of the role's ended makes room for it again; a key whose row was freed is granted
    // above its old fence.
    assert!(held[0].release(&mut busy));
    let again = fast("pair-0").run(&mut busy).expect("no room after a lease of the role's ended");
    assert!(again.fence > first.unwrap(), "pair-0 granted {} after {}", again.fence, first.unwrap());
}

fn message(err: &postgres::Error) -> String {
    err.as_db_error().map(|db| db.message().to_owned()).unwrap_or_default()
}

fn connect(cluster: &Cluster, database: &str, user: &str) -> Client {
    let config = format!(
        "host=127.0.0.1 port={} user={user} dbname={database} application_name=pg_fence_it",
        cluster.port()
    );
    Client::connect(&config, postgres::NoTls).unwrap()
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

/// A clean restart forgets fast leases in shared memory as a crash does: their holders are told
/// (PF001), and the first grant afterwards waits for the server's clock to pass the fast
/// reservation, which runs at most 2 s ahead of the clock: measured inside the call, on the
/// server's clock (from the statement's start to the grant's acquired_at). The restart itself takes
/// some of that, so the wait is under the lead; with the lead of 10 s it was 8-9 s.
#[test]
fn a_clean_restart_ends_fast_leases_and_the_first_grant_after_it_waits_under_the_reservations_lead() {
    let cluster = in_memory("mem_clean_restart", 27678, 1000);
    let mut client = cluster.connect();
    // The cluster's first fast grant raises the reservation ahead of the clock.
    let lease = fast("kept?").run(&mut client).unwrap();
    drop(client);
    cluster.stop_and_start();
    let mut client = cluster.connect();
    let renewed = lease.renew(&mut client, "1 minute").map_err(|err| sqlstate(&err));
    assert_eq!(renewed, Err("PF001".into()), "a fast lease outlived a clean restart");
    let waited: f64 = client
        .query_one(
            "SELECT extract(epoch FROM l.acquired_at - statement_timestamp())::float8
               FROM fence.lease_acquire('first', '1 minute', durable => false) l",
            &[],
        )
        .unwrap()
        .get(0);
    println!("the first grant after a clean restart waited {waited:.3} s");
    assert!(waited < 5.0, "the first grant after the restart waited {waited:.3} s for the clock");
}

/// A grant that needs room frees no row whose writer under the ended lease still has its guarded
/// transaction open: the key's next exclusive grant must still wait for that writer, which only the
/// row tells (invariant 3). Other ended rows are freed.
#[test]
fn room_is_not_made_under_an_open_writer() {
    let cluster = in_memory("mem_room_guard", 27680, 2);
    let (mut writer, mut client) = (cluster.connect(), cluster.connect());
    let shared = fast("guarded").shared(true).run(&mut writer).unwrap();
    writer.batch_execute("BEGIN").unwrap();
    writer.query_one("SELECT fence.fence_guard('guarded', $1)", &[&shared.fence]).unwrap();
    assert!(fast("other").run(&mut client).unwrap().release(&mut client));
    client.query_one("SELECT fence.lease_revoke('guarded')", &[]).unwrap();
    // The table is full of ended rows: "other"'s is freed, "guarded"'s is kept, also when the
    // grant that needs room is the writer's own (its own locks never stop it).
    let third = fast("third").run(&mut writer).expect("no room though a row could be freed");
    assert!(third.release(&mut writer));
    let exclusive = fast("guarded").try_run(&mut client).map_err(|err| sqlstate(&err));
    assert_eq!(
        exclusive,
        Ok(None),
        "granted exclusively while a writer under the ended shared lease is open"
    );
    writer.batch_execute("COMMIT").unwrap();
    assert!(fast("guarded").run(&mut client).is_some(), "still held after the writer committed");
}

/// A row is charged to the role whose lease holds it: a role that takes over another role's ended
/// rows is charged for them, and the other has its room back. (They stayed charged to the role
/// that made them: the taker held them free of its limit, and the maker, at its limit, could not
/// free them.)
#[test]
fn a_row_is_charged_to_the_role_whose_lease_takes_it() {
    let cluster = Cluster::start(
        "mem_recharge",
        27681,
        &["shared_preload_libraries=pg_fence", "pg_fence.fast_leases=100", "pg_fence.fast_leases_per_role=5"],
    );
    let mut admin = cluster.connect();
    admin
        .batch_execute("CREATE ROLE maker LOGIN; CREATE ROLE taker LOGIN; GRANT fence_user TO maker, taker")
        .unwrap();
    let (mut maker, mut taker) =
        (connect(&cluster, "postgres", "maker"), connect(&cluster, "postgres", "taker"));
    for i in 0..5 {
        assert!(fast(&format!("k{i}")).run(&mut maker).unwrap().release(&mut maker));
    }
    for i in 0..5 {
        fast(&format!("k{i}")).run(&mut taker).expect("the maker's key is free");
    }
    let mut made = Vec::new();
    for i in 0..5 {
        let granted = fast(&format!("n{i}")).try_run(&mut maker).map_err(|err| sqlstate(&err));
        assert!(matches!(granted, Ok(Some(_))), "the maker's new key {i}: {granted:?}");
        made.extend(granted.unwrap());
    }
    let err = fast("one-more").try_run(&mut taker).unwrap_err();
    assert_eq!(sqlstate(&err), "53400", "the taker holds 5 rows, its limit: {err:?}");
    // Only a lease taking a row moves its charge: the taker, at its limit, releases a lease of the
    // maker's with its token.
    let released = made[0].try_release(&mut taker).map_err(|err| sqlstate(&err));
    assert_eq!(released, Ok(true), "a release by a role at its limit");
}
