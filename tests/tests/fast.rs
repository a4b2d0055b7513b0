//! Fast leases (`durable => false`) through the faults that end them: kill -9 of the server and a
//! failover to a standby. Afterwards their holders' renewals fail with PF001 and their guarded
//! writes with PF002, no grant of either kind gets a fence that any client was told before, and
//! durable leases held across the fault survive. And what a fast lease costs at commit: no WAL
//! flush, and no WAL but the commit record.
use pg_fence_integration::{
    commit_flushed, edition, fast_leases_in_memory, inspect_wal, next_history,
    reserve_fast_fences_for_an_hour, sqlstate, wal_insert_position, wal_records_between, Acquire, Cluster,
    Edition, Lease,
};
use postgres::Client;
use rand::Rng;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

/// The WAL writer flushes rarely, so that a commit that skipped its flush stays visibly unflushed,
/// and an acknowledged fast grant is most likely lost in the crash.
const LAZY_WAL_WRITER: &[&str] = &["wal_writer_delay=10s", "wal_writer_flush_after=1GB", "autovacuum=off"];

const CHURN_KEYS: usize = 8;

/// A write to the resource `target`, fenced by the lease.
fn guarded_write(client: &mut Client, lease: &Lease) -> Result<(), postgres::Error> {
    client
        .query_one(
            "SELECT fence.fenced_update($1, $2, 'target', jsonb_build_object('fence', $2::bigint), '{\"id\": 1}')",
            &[&lease.key, &lease.fence],
        )
        .map(|_| ())
}

fn setup(client: &mut Client) {
    client
        .batch_execute(
            "CREATE TABLE target (id int PRIMARY KEY, fence bigint); INSERT INTO target VALUES (1, 0)",
        )
        .unwrap();
}

/// Leases held across the fault: one fast and one durable per index, all with a long TTL.
fn hold(client: &mut Client, count: usize) -> (Vec<Lease>, Vec<Lease>) {
    let mut grant = |name: &str, i: usize, durable: bool| {
        Acquire::new(&format!("{name}-{i}"), "1 hour").durable(durable).run(client).expect("a free key")
    };
    let fast = (0..count).map(|i| grant("held-fast", i, false)).collect();
    let durable = (0..count).map(|i| grant("held-durable", i, true)).collect();
    (fast, durable)
}

/// Clients granting keys of CHURN_KEYS, each grant fast or durable at random and released at once
/// or left to expire, until `stop`: every fence a client was told, with its key. A grant is told
/// when its statement returns (in autocommit, its commit has returned too).
fn churn(
    cluster: &Cluster,
    clients: usize,
    stop: Arc<AtomicBool>,
) -> Vec<thread::JoinHandle<Vec<(String, i64)>>> {
    (0..clients)
        .map(|_| {
            let mut client = cluster.connect();
            let stop = stop.clone();
            thread::spawn(move || {
                let mut told = Vec::new();
                let mut rng = rand::thread_rng();
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("churn-{}", rng.gen_range(0..CHURN_KEYS));
                    match Acquire::new(&key, "150 milliseconds")
                        .durable(rng.gen_bool(0.7))
                        .try_run(&mut client)
                    {
                        Ok(Some(lease)) => {
                            told.push((key, lease.fence));
                            if rng.gen_bool(0.5) && lease.try_release(&mut client).is_err() {
                                break;
                            }
                        }
                        Ok(None) => {}
                        Err(_) => break, // the server is gone
                    }
                }
                told
            })
        })
        .collect()
}

/// On the server after the fault: fast holders are told their lease is lost and their writes are
/// refused; durable holders keep theirs; nothing shows a fast lease any more.
fn assert_fast_leases_ended(client: &mut Client, fast: &[Lease], durable: &[Lease], when: &str) {
    for lease in fast {
        let renewed = lease.renew(client, "1 hour").map(drop).map_err(|err| sqlstate(&err));
        assert_eq!(renewed, Err("PF001".to_string()), "{when}: renewal of fast lease {}", lease.key);
        let written = guarded_write(client, lease).map_err(|err| sqlstate(&err));
        assert_eq!(written, Err("PF002".to_string()), "{when}: guarded write of fast lease {}", lease.key);
    }
    for lease in durable {
        lease
            .renew(client, "1 hour")
            .unwrap_or_else(|err| panic!("{when}: durable lease {} lost: {err}", lease.key));
        guarded_write(client, lease)
            .unwrap_or_else(|err| panic!("{when}: durable lease {} refused: {err}", lease.key));
    }
    let shown: i64 =
        client.query_one("SELECT count(*) FROM fence.leases WHERE NOT durable", &[]).unwrap().get(0);
    assert_eq!(shown, 0, "{when}: fast leases still shown");
}

/// Every key granted again, fast this time, after `next_history` granted it durably: above both.
fn assert_fast_grants_above(client: &mut Client, told: &[(String, i64)], when: &str) {
    let mut keys: Vec<&String> = told.iter().map(|(key, _)| key).collect();
    keys.sort();
    keys.dedup();
    for key in keys {
        let highest = told.iter().filter(|(k, _)| k == key).map(|(_, fence)| *fence).max().unwrap();
        let current: i64 = client.query_one("SELECT fence.current_fence($1)", &[key]).unwrap().get(0);
        assert!(current > highest, "{when}: {key} granted {current}, but {highest} was told before");
        // next_history's grant is live for a minute: take it over by revoking it.
        client.query_one("SELECT fence.lease_revoke($1)", &[key]).unwrap();
        let fast = Acquire::new(key, "1 minute").durable(false).run(client).expect("revoked key is free");
        assert!(fast.fence > current, "{when}: fast grant {} of {key} after {current}", fast.fence);
    }
}

#[test]
fn a_crash_ends_fast_leases_and_no_fence_comes_back() {
    let cluster = Cluster::start("fast_crash", 27401, LAZY_WAL_WRITER);
    setup(&mut cluster.connect());
    let mut forgotten = 0;
    for round in 0..3 {
        let when = format!("round {round}");
        let mut holder = cluster.connect();
        let (fast, durable) = hold(&mut holder, 3);
        let stop = Arc::new(AtomicBool::new(false));
        let workers = churn(&cluster, 3, stop.clone());
        thread::sleep(Duration::from_millis(1_000));
        cluster.crash();
        stop.store(true, Ordering::Relaxed);
        let mut told: Vec<(String, i64)> = workers.into_iter().flat_map(|w| w.join().unwrap()).collect();
        assert!(told.len() > 10, "{when}: only {} grants before the crash", told.len());
        told.extend(fast.iter().chain(&durable).map(|lease| (lease.key.clone(), lease.fence)));
        cluster.restart();
        let mut client = cluster.connect();
        assert_fast_leases_ended(&mut client, &fast, &durable, &when);
        for lease in &durable {
            lease.release(&mut client);
        }
        let outcome = next_history(&mut client, &told);
        assert_eq!((outcome.reissued, outcome.stale_guards_accepted), (0, 0), "{when}: {outcome:?}");
        forgotten += outcome.forgotten;
        assert_fast_grants_above(&mut client, &told, &when);
        for (key, _) in &told {
            client.query_one("SELECT fence.lease_revoke($1)", &[key]).unwrap();
        }
    }
    // The crashes did forget fences (the fast leases' at least), or this test would prove nothing.
    assert!(forgotten > 0, "no crash forgot a fence");
}

#[test]
fn a_failover_ends_fast_leases_and_no_fence_comes_back() {
    let primary = Cluster::start("fast_primary", 27402, &[]);
    setup(&mut primary.connect());
    let standby = Cluster::start_standby("fast_standby", &primary, 27403, &[]);
    standby.walreceiver_pid();
    let mut client = primary.connect();
    let (fast, durable) = hold(&mut client, 3);
    let mut told: Vec<(String, i64)> =
        fast.iter().chain(&durable).map(|l| (l.key.clone(), l.fence)).collect();
    // Fast grants and releases of the same keys, some released: their fences reach no standby.
    for i in 0..20 {
        let lease = Acquire::new(&format!("churn-{}", i % 4), "1 minute")
            .durable(i % 3 != 0)
            .run(&mut client)
            .unwrap();
        told.push((lease.key.clone(), lease.fence));
        lease.release(&mut client);
    }
    // The releases commit without a flush, and reach the standby once the WAL writer has sent them.
    standby.wait_until_replayed(&mut client);
    let mut on_standby = standby.connect();

    // The standby reads the leases it has (durable ones) and refuses fast grants like any change.
    let shown: Vec<(String, bool)> = on_standby
        .query("SELECT key, durable FROM fence.leases WHERE live ORDER BY key", &[])
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let expected: Vec<(String, bool)> = durable.iter().map(|l| (l.key.clone(), true)).collect();
    assert_eq!(shown, expected);
    let current = |client: &mut Client, key: &str| -> Option<i64> {
        client.query_one("SELECT fence.current_fence($1)", &[&key]).unwrap().get(0)
    };
    assert_eq!(current(&mut on_standby, &durable[0].key), Some(durable[0].fence));
    assert_eq!(current(&mut on_standby, &fast[0].key), None, "a fast lease's fence on the standby");
    let refused = Acquire::new("on-standby", "1 minute")
        .durable(false)
        .try_run(&mut on_standby)
        .map(|_| ())
        .map_err(|e| sqlstate(&e));
    assert_eq!(refused, Err("25006".to_string()));

    standby.promote();
    let mut promoted = standby.connect();
    assert_fast_leases_ended(&mut promoted, &fast, &durable, "promoted");
    for lease in &durable {
        lease.release(&mut promoted);
    }
    let outcome = next_history(&mut promoted, &told);
    assert_eq!((outcome.reissued, outcome.stale_guards_accepted), (0, 0), "{outcome:?}");
    assert!(outcome.forgotten > 0, "the promoted standby forgot no fence: {outcome:?}");
    assert_fast_grants_above(&mut promoted, &told, "promoted");
}

#[test]
fn fast_grants_renewals_and_releases_wait_for_no_flush_and_write_only_their_commit() {
    let cluster = Cluster::start("fast_wal", 27404, LAZY_WAL_WRITER);
    let mut client = cluster.connect();
    inspect_wal(&mut client);
    Acquire::new("warm", "1 minute").durable(false).run(&mut client).unwrap().release(&mut client);
    reserve_fast_fences_for_an_hour(&mut client);
    // CREATE EXTENSION leaves dead catalog rows that the next statements would prune, writing WAL.
    client.batch_execute("VACUUM").unwrap();
    let mut unexpected = Vec::new();
    let mut flushed_commits = 0;
    let mut check = |client: &mut Client, what: &str, call: &dyn Fn(&mut Client)| {
        let start = wal_insert_position(client);
        call(client);
        let end = wal_insert_position(client);
        // A call that wrote no WAL (in shared memory) has no commit to flush.
        flushed_commits += usize::from(commit_flushed(client, &start) == Some(true));
        let records = wal_records_between(client, &start, &end);
        // In shared memory a fast lease's call writes nothing at all, not even a commit record.
        let expected: &[&str] = if fast_leases_in_memory() { &[] } else { &["Transaction/COMMIT"] };
        if records != expected {
            unexpected.push(format!("{what}: {records:?}"));
        }
    };
    for trial in 0..10 {
        let key = format!("fast-{trial}");
        let lease = Acquire::new(&key, "1 minute").durable(false).run(&mut client).unwrap();
        let renewed = lease.clone();
        check(&mut client, "renew", &move |c| {
            renewed.renew(c, "1 hour").unwrap();
        });
        check(&mut client, "release", &move |c| {
            lease.release(c);
        });
        let key = format!("fast-{trial}");
        check(&mut client, "grant again", &move |c| {
            Acquire::new(&key, "1 minute").durable(false).run(c).unwrap();
        });
        let key = format!("fast-new-{trial}");
        check(&mut client, "first grant", &move |c| {
            Acquire::new(&key, "1 minute").durable(false).run(c).unwrap();
        });
    }
    assert_eq!(unexpected, Vec::<String>::new(), "fast calls that wrote more than their commit record");
    assert_eq!(flushed_commits, 0, "fast calls whose commit was flushed when it returned");

    // The check can fail: a durable grant writes its row and waits for the flush.
    let start = wal_insert_position(&mut client);
    Acquire::new("durable", "1 minute").durable(true).run(&mut client).unwrap();
    let end = wal_insert_position(&mut client);
    assert_eq!(commit_flushed(&mut client, &start), Some(true), "a durable grant's commit was not flushed");
    let records = wal_records_between(&mut client, &start, &end);
    assert!(records.len() > 1, "a durable grant wrote only {records:?}");
}

/// Every fast fence a client is told is covered by the fast reservation as committed (and so
/// flushed), which is what a crash keeps: also after a raise of the reservation was rolled back
/// with a savepoint, and the backend that made it grants again.
#[test]
fn every_fast_fence_told_is_covered_by_a_committed_reservation() {
    let cluster = Cluster::start("fast_reserve", 27405, &["max_prepared_transactions=2"]);
    let mut client = cluster.connect();
    let reserved = |client: &mut Client| -> Option<i64> {
        client.query_one("SELECT max(fence) FROM fence.fast_reserve", &[]).unwrap().get(0)
    };
    let mut tx = client.transaction().unwrap();
    tx.batch_execute("SAVEPOINT s").unwrap();
    Acquire::new("rolled-back", "1 minute").durable(false).run(&mut tx).expect("free");
    tx.batch_execute("ROLLBACK TO SAVEPOINT s").unwrap();
    tx.commit().unwrap();
    assert_eq!(reserved(&mut client), None, "a rolled-back raise stayed");
    let told = Acquire::new("k", "1 minute").durable(false).run(&mut client).expect("free").fence;
    let covered = reserved(&mut client);
    assert!(covered.is_some_and(|r| r >= told), "fast fence {told} told, reservation {covered:?}");

    // A prepared transaction outlives the crash that ends its fast lease: refused.
    let mut tx = client.transaction().unwrap();
    Acquire::new("prepared", "1 minute").durable(false).run(&mut tx).expect("free");
    if edition() == Edition::Sql {
        // PL/pgSQL has no hook to refuse the PREPARE (tests/regress/sql-edition/README.md).
        println!("skipped on the SQL edition: PREPARE TRANSACTION refused after a fast grant");
        return;
    }
    let err = tx.batch_execute("PREPARE TRANSACTION 'fast'").unwrap_err();
    assert_eq!(sqlstate(&err), "0A000", "{err}");
}

#[test]
fn the_first_grant_after_a_crash_that_waits_for_the_clock_gets_its_whole_ttl() {
    let cluster = Cluster::start("fast_first_after_crash", 27406, &[]);
    let mut client = cluster.connect();
    for n in 0..20 {
        Acquire::new(&format!("fast:{n}"), "1 minute").durable(false).run(&mut client).unwrap();
    }
    drop(client);
    cluster.crash();
    cluster.restart();
    let mut client = cluster.connect();
    // The reservation runs up to 2 s ahead of the clock, and a crash restart takes some of that (a
    // busy machine's all of it): the reservation raised by hand to 1.5 s ahead of the clock, as the
    // last fast grants before the crash could have left it, makes the first grant wait, whatever
    // the restart took.
    client
        .batch_execute(
            "INSERT INTO fence.fast_reserve
             SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint + 1500000",
        )
        .unwrap();
    // Measured inside the call, on the server's clock: from the statement's start to the grant.
    let row = client
        .query_one(
            "SELECT extract(epoch FROM l.acquired_at - statement_timestamp())::float8,
                    extract(epoch FROM l.acquired_at)::float8, extract(epoch FROM l.expires_at)::float8,
                    l.token
               FROM fence.lease_acquire('after', '5 seconds') l",
            &[],
        )
        .unwrap();
    let (waited, acquired_at, expires_at): (f64, f64, f64) = (row.get(0), row.get(1), row.get(2));
    assert!(
        waited > 1.0,
        "the first grant after the crash waited {waited:.3} s for a reservation 1.5 s ahead"
    );
    let now: f64 =
        client.query_one("SELECT extract(epoch FROM clock_timestamp())::float8", &[]).unwrap().get(0);
    assert!((expires_at - acquired_at - 5.0).abs() < 0.001, "granted for {} s", expires_at - acquired_at);
    assert!(
        expires_at - now > 4.0,
        "after waiting {waited:.3} s, the lease had {:.3} s left",
        expires_at - now
    );
    let token: uuid::Uuid = row.get(3);
    let renewed = client.query_one("SELECT fence.lease_renew('after', $1, '5 seconds')", &[&token]);
    renewed.expect("the first grant after the crash was already over");
}
