//! Lease sets (fence.lease_acquire_all, lease_renew_all, lease_release_all) from real clients: all
//! keys or none, a lease of its own per key under one token, overlapping sets from many sessions
//! that never deadlock and never share a key, and a waiting set that single-key acquirers do not
//! starve.
use pg_fence_integration::{
    acquire, backend_pid, eventually, sqlstate, wait_event, wait_until_past, Cluster,
};
use postgres::Client;
use rand::seq::SliceRandom;
use std::thread;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Bounds how long a broken test hangs; never a measure of speed.
const GENEROUS: Duration = Duration::from_secs(60);

/// lease_acquire_all: each lease as (key, fence, token); empty when the set was refused.
fn acquire_all(client: &mut Client, keys: &[&str], ttl: &str, wait: &str) -> Vec<(String, i64, Uuid)> {
    let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
    client
        .query(
            "SELECT key, fence, token FROM fence.lease_acquire_all($1, $2::text::interval, wait => $3::text::interval)",
            &[&keys, &ttl, &wait],
        )
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect()
}

fn live_fence(client: &mut Client, key: &str) -> Option<i64> {
    client
        .query_opt("SELECT fence FROM fence.leases WHERE key = $1 AND live", &[&key])
        .unwrap()
        .map(|row| row.get(0))
}

#[test]
fn a_set_is_granted_whole_or_not_at_all_and_kept_in_one_call() {
    let cluster = Cluster::start("sets_whole", 27480, &[]);
    let (mut client, mut other) = (cluster.connect(), cluster.connect());
    let held = acquire(&mut other, "b", "1 hour").expect("b is free");
    assert!(acquire_all(&mut client, &["a", "b", "c"], "1 hour", "0").is_empty(), "granted with b held");
    assert_eq!(
        (live_fence(&mut client, "a"), live_fence(&mut client, "c")),
        (None, None),
        "part of a refused set"
    );
    assert!(held.release(&mut other));

    let set = acquire_all(&mut client, &["c", "a", "b"], "1 hour", "0");
    let keys: Vec<&str> = set.iter().map(|(key, _, _)| key.as_str()).collect();
    assert_eq!(keys, ["a", "b", "c"], "one lease per key, in key order");
    let token = set[0].2;
    assert!(set.iter().all(|(_, _, t)| *t == token), "the set's leases share one token");
    for (key, fence, _) in &set {
        assert_eq!(live_fence(&mut client, key), Some(*fence));
        client.query_one("SELECT fence.fence_guard($1, $2)", &[key, fence]).unwrap();
    }
    let b_fence = set[1].1;
    assert!(b_fence > held.fence, "b granted again below its old fence");

    let names = vec!["a".to_string(), "b".into(), "c".into()];
    client.query_one("SELECT fence.lease_renew_all($1, $2, '2 hours')", &[&names, &token]).unwrap();
    // One lease of the set lost: the set's renewal fails whole, renewing none of the others.
    client.query_one("SELECT fence.lease_revoke('b')", &[]).unwrap();
    let before: f64 = client
        .query_one("SELECT extract(epoch FROM expires_at)::float8 FROM fence.leases WHERE key = 'a'", &[])
        .unwrap()
        .get(0);
    let err =
        client.query_one("SELECT fence.lease_renew_all($1, $2, '3 hours')", &[&names, &token]).unwrap_err();
    assert_eq!(sqlstate(&err), "PF001", "{err}");
    let after: f64 = client
        .query_one("SELECT extract(epoch FROM expires_at)::float8 FROM fence.leases WHERE key = 'a'", &[])
        .unwrap()
        .get(0);
    assert_eq!(before, after, "a failed renewal of the set renewed a");
    let released: i32 =
        client.query_one("SELECT fence.lease_release_all($1, $2)", &[&names, &token]).unwrap().get(0);
    assert_eq!(released, 2, "a and c were still held; b was revoked");
    let again: i32 =
        client.query_one("SELECT fence.lease_release_all($1, $2)", &[&names, &token]).unwrap().get(0);
    assert_eq!(again, 0, "a retried release ends nothing");
}

/// 8 sessions take random 3-key sets of 6 keys, with `wait`, over and over, each recording its
/// grants in the transaction that makes them and when it ended them: every session finishes (no
/// deadlock, no endless wait), and no key was ever held by two sets at once.
#[test]
fn overlapping_sets_never_deadlock_and_never_share_a_key() {
    let cluster = Cluster::start("sets_race", 27481, &[]);
    cluster
        .connect()
        .batch_execute(
            "CREATE TABLE held (key text, fence bigint, since timestamptz, until timestamptz, PRIMARY KEY (key, fence))",
        )
        .unwrap();
    let started = Instant::now();
    let sessions: Vec<_> = (0..8)
        .map(|_| {
            let mut client = cluster.connect();
            thread::spawn(move || {
                let keys = ["k1", "k2", "k3", "k4", "k5", "k6"];
                let mut granted = 0;
                for _ in 0..40 {
                    let mut set: Vec<&str> = keys.choose_multiple(&mut rand::thread_rng(), 3).copied().collect();
                    set.shuffle(&mut rand::thread_rng());
                    let names: Vec<String> = set.iter().map(|k| k.to_string()).collect();
                    let mut tx = client.transaction().unwrap();
                    let rows = tx
                        .query(
                            "WITH granted AS (
                                 SELECT key, fence, token FROM fence.lease_acquire_all($1, '1 minute', wait => '30 s')),
                             recorded AS (INSERT INTO held SELECT key, fence, clock_timestamp(), NULL FROM granted)
                             SELECT fence, token, key FROM granted",
                            &[&names],
                        )
                        .unwrap();
                    tx.commit().unwrap();
                    assert_eq!(rows.len(), 3, "a set with a 30 s wait was refused");
                    granted += 1;
                    thread::sleep(Duration::from_millis(2));
                    // The end is recorded before the release, in its transaction: never after it.
                    let fences: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
                    let keys_of = |rows: &[postgres::Row]| rows.iter().map(|r| r.get::<_, String>(2)).collect::<Vec<_>>();
                    let mut tx = client.transaction().unwrap();
                    tx.execute("UPDATE held SET until = clock_timestamp() WHERE (key, fence) IN (SELECT unnest($1::text[]), unnest($2::bigint[]))", &[&keys_of(&rows), &fences])
                        .unwrap();
                    let released: i32 = tx
                        .query_one("SELECT fence.lease_release_all($1, $2)", &[&names, &rows[0].get::<_, Uuid>(1)])
                        .unwrap()
                        .get(0);
                    tx.commit().unwrap();
                    assert_eq!(released, 3);
                }
                granted
            })
        })
        .collect();
    assert!(eventually(GENEROUS, || sessions.iter().all(|s| s.is_finished())), "the sessions never finished");
    let granted: i32 = sessions.into_iter().map(|s| s.join().unwrap()).sum();
    println!("{granted} sets granted in {:?}", started.elapsed());
    let overlaps: i64 = cluster
        .connect()
        .query_one(
            "SELECT count(*) FROM held a JOIN held b ON a.key = b.key AND a.fence < b.fence
              WHERE b.since < coalesce(a.until, 'infinity')",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(overlaps, 0, "a key was held by two sets at once");
}

/// A set that waits holds the waiting rooms of all its keys: an acquire of one of its free keys
/// without `wait` is refused meanwhile, so single-key acquirers cannot starve it, and it is granted
/// as soon as its last held key is released.
#[test]
fn a_waiting_set_is_first_in_line_for_every_key() {
    let cluster = Cluster::start("sets_line", 27482, &[]);
    let (mut holder, mut other, mut observer) = (cluster.connect(), cluster.connect(), cluster.connect());
    let held = acquire(&mut holder, "s1", "1 hour").expect("s1 is free");
    let mut waiter = cluster.connect();
    let pid = backend_pid(&mut waiter);
    let set = thread::spawn(move || acquire_all(&mut waiter, &["s1", "s2"], "1 minute", "20 s"));
    let sleeping = || wait_event(&mut observer, pid).0.as_deref() == Some("Extension");
    assert!(eventually(GENEROUS, sleeping), "the set never waited");
    assert!(
        acquire(&mut other, "s2", "1 minute").is_none(),
        "a single acquire jumped ahead of the waiting set"
    );
    assert!(held.release(&mut holder));
    let granted = set.join().unwrap();
    assert_eq!(granted.len(), 2, "the set was not granted once s1 was released");
}

/// A transaction that holds one key of a waiting set (its lock, from a renewal in the same
/// transaction) and then waits for another of the set's keys: the set must not queue for the lock
/// it holds while holding the room it waits for, which would be a deadlock (40P01 to one of them).
#[test]
fn a_waiting_set_never_deadlocks_with_a_transaction_holding_one_of_its_keys() {
    let cluster = Cluster::start("sets_holder", 27483, &[]);
    let (mut holder, mut observer) = (cluster.connect(), cluster.connect());
    let b = acquire(&mut holder, "b", "1 hour").expect("b is free");
    let mut waiter = cluster.connect();
    let pid = backend_pid(&mut waiter);
    let set = thread::spawn(move || {
        let keys = vec!["a".to_string(), "b".to_string()];
        waiter
            .query("SELECT key FROM fence.lease_acquire_all($1, '1 minute', wait => '30 s')", &[&keys])
            .map(|rows| rows.len())
            .map_err(|err| sqlstate(&err))
    });
    assert!(eventually(GENEROUS, || wait_event(&mut observer, pid).0.is_some()), "the set never waited");
    let mut tx = holder.transaction().unwrap();
    b.renew(&mut tx, "1 hour").unwrap(); // holds b's lock until this transaction ends
    let a = pg_fence_integration::Acquire::new("a", "1 minute").wait("3 s").try_run(&mut tx);
    let a = a.map(|lease| lease.is_some()).map_err(|err| sqlstate(&err));
    assert_eq!(a, Ok(false), "the set is first in line for a, and holds it back");
    tx.commit().unwrap();
    assert!(b.release(&mut holder));
    assert_eq!(set.join().unwrap(), Ok(2), "the set was not granted once b was released");
}

/// A key whose ended shared holder (or permit holder above slot 0) still has a guarded transaction
/// open counts as held for a set, as for a single acquire: without `wait` the set is refused (no
/// row), with `wait` it waits for that transaction and is then granted; never 40001 in READ
/// COMMITTED. (The set used to fail with 40001 at once, granting its other keys first.)
#[test]
fn a_set_waits_for_a_writer_under_an_ended_lease() {
    let cluster = Cluster::start("sets_guarded", 27484, &[]);
    let (mut writer, mut client) = (cluster.connect(), cluster.connect());
    let pid = backend_pid(&mut client);
    for (key, mode) in [("shared-key", "shared => true"), ("permit-key", "permits => 2")] {
        // Two holders, so that the writer's is not in slot 0 for the semaphore.
        let sql = format!(
            "SELECT fence, token, extract(epoch FROM expires_at)::float8 FROM fence.lease_acquire($1, '1 second', {mode})"
        );
        writer.query_one(&sql, &[&key]).unwrap();
        let row = writer.query_one(&sql, &[&key]).unwrap();
        let (fence, expires_at): (i64, f64) = (row.get(0), row.get(2));
        writer.batch_execute("BEGIN").unwrap();
        let guarded: bool =
            writer.query_one("SELECT fence.fence_guard($1, $2)", &[&key, &fence]).unwrap().get(0);
        assert!(guarded);
        wait_until_past(&mut client, expires_at); // both leases have expired; the transaction stays open
        let refused =
            client.query("SELECT key FROM fence.lease_acquire_all(ARRAY[$1, 'other'], '1 minute')", &[&key]);
        let refused = refused.map(|rows| rows.len()).map_err(|err| sqlstate(&err));
        assert_eq!(refused, Ok(0), "{key}: the set without wait");
        let mut observer = cluster.connect();
        let ends_writer = thread::spawn(move || {
            // Once the set waits (on the writer's key lock).
            assert!(
                eventually(GENEROUS, || wait_event(&mut observer, pid).0.is_some()),
                "the set never waited"
            );
            writer.batch_execute("COMMIT").unwrap();
            writer
        });
        let granted = client
            .query(
                "SELECT key FROM fence.lease_acquire_all(ARRAY[$1, 'other'], '1 minute', wait => '10 s')",
                &[&key],
            )
            .map(|rows| rows.len())
            .map_err(|err| sqlstate(&err));
        assert_eq!(granted, Ok(2), "{key}: the set with wait");
        writer = ends_writer.join().unwrap();
        client.batch_execute("SELECT fence.lease_revoke('other')").unwrap();
    }
}

/// lease_renew_all's PF001 names the first key its token no longer holds, and why.
#[test]
fn a_lost_set_says_which_key_and_why() {
    let cluster = Cluster::start("sets_lost", 27485, &[]);
    let mut client = cluster.connect();
    let set = acquire_all(&mut client, &["a", "b"], "1 minute", "0");
    let token = set[0].2;
    client.query_one("SELECT fence.lease_revoke('b')", &[]).unwrap();
    let err = client
        .query_one("SELECT fence.lease_renew_all(ARRAY['a', 'b'], $1, '1 minute')", &[&token])
        .unwrap_err();
    assert_eq!(sqlstate(&err), "PF001");
    let detail = err.as_db_error().and_then(|db| db.detail()).unwrap_or_default().to_owned();
    assert!(detail.contains(r#"key "b": reason revoked"#), "{detail}");
}
