//! Leases seen from real clients: many sessions racing for few keys, and a holder that outlives
//! its TTL.
use pg_fence_integration::{acquire, sqlstate, wait_until_past, Acquire, Cluster, Lease};
use rand::Rng;
use std::thread;
use std::time::Duration;

/// 16 sessions x 2,000 attempts on 4 keys with short TTLs. Each grant is recorded in the same
/// transaction that makes it, and each release records when the lease ended (server time), so the
/// record is exactly the set of committed grants. Then, per key: fences are unique and strictly
/// increasing in grant order, the key's current fence is its last grant's, and no two grants were
/// live at once.
#[test]
fn racing_sessions_never_share_a_key_and_fences_strictly_increase() {
    let cluster = Cluster::start("race", 26101, &[]);
    cluster
        .connect()
        .batch_execute(
            "CREATE TABLE grants (key text, fence bigint, acquired_at timestamptz, ends_at timestamptz,
                                  PRIMARY KEY (key, fence))",
        )
        .unwrap();

    let workers: Vec<_> = (0..16)
        .map(|_| {
            let mut client = cluster.connect();
            thread::spawn(move || {
                let mut rng = rand::thread_rng();
                let mut granted = 0;
                let mut stale_releases_accepted = 0;
                let mut old_leases: Vec<Lease> = Vec::new();
                for _ in 0..2_000 {
                    let key = format!("key-{}", rng.gen_range(0..4));
                    let ttl = format!("{} milliseconds", rng.gen_range(2..30));
                    let mut tx = client.transaction().unwrap();
                    let Some(lease) = acquire(&mut tx, &key, &ttl) else {
                        tx.commit().unwrap();
                        continue;
                    };
                    let (fence, token) = (lease.fence, lease.token);
                    tx.execute(
                        "INSERT INTO grants SELECT key, fence, acquired_at, expires_at
                           FROM fence.leases WHERE key = $1",
                        &[&key],
                    )
                    .unwrap();
                    tx.commit().unwrap();
                    granted += 1;
                    // A token whose lease was released must never end anyone's lease (invariant 4).
                    if let Some(old) = old_leases.pop() {
                        stale_releases_accepted += i32::from(old.release(&mut client));
                    }
                    if rng.gen_bool(0.2) {
                        // Renew, recording the new end with it; the lease may already have expired
                        // (lease lost, PF001).
                        let renew = "UPDATE grants SET ends_at = fence.lease_renew($1, $2, '20 milliseconds')
                                      WHERE key = $1 AND fence = $3";
                        if let Err(err) = client.execute(renew, &[&key, &token, &fence]) {
                            assert_eq!(sqlstate(&err), "PF001", "{err}");
                        }
                    }
                    // Sometimes let the lease run out instead of releasing it.
                    if rng.gen_bool(0.2) {
                        continue;
                    }
                    if rng.gen_bool(0.1) {
                        thread::sleep(Duration::from_millis(rng.gen_range(1..20)));
                    }
                    let mut tx = client.transaction().unwrap();
                    if lease.release(&mut tx) {
                        old_leases.push(lease);
                        // After release, the view's expires_at is the moment the lease ended.
                        tx.execute(
                            "UPDATE grants g SET ends_at = l.expires_at FROM fence.leases l
                              WHERE g.key = $1 AND g.fence = $2 AND l.key = g.key",
                            &[&key, &fence],
                        )
                        .unwrap();
                    }
                    tx.commit().unwrap();
                }
                assert_eq!(stale_releases_accepted, 0, "a stale token ended a lease");
                granted
            })
        })
        .collect();
    let granted: i64 = workers.into_iter().map(|w| w.join().unwrap()).sum();

    let mut client = cluster.connect();
    let recorded: i64 = client.query_one("SELECT count(*) FROM grants", &[]).unwrap().get(0);
    assert_eq!(recorded, granted);
    assert!(granted > 1_000, "too few grants to mean anything: {granted}");

    // No fence was granted twice (the primary key would have refused the second record), and each
    // key's current fence is the highest recorded: no committed grant escaped the record.
    let keys: i64 = client.query_one("SELECT count(DISTINCT key) FROM grants", &[]).unwrap().get(0);
    assert_eq!(keys, 4, "not every key was granted");
    let unrecorded = client
        .query(
            "SELECT key, top, fence.current_fence(key)
               FROM (SELECT key, max(fence) AS top FROM grants GROUP BY key) k
              WHERE fence.current_fence(key) IS DISTINCT FROM top",
            &[],
        )
        .unwrap();
    assert!(
        unrecorded.is_empty(),
        "{} keys whose current fence is not their last recorded grant",
        unrecorded.len()
    );

    // In order of grant time, fences strictly increase and each grant starts after the previous
    // lease ended.
    let violations = client
        .query(
            "SELECT key, prev_fence, fence, prev_end, acquired_at FROM (
                 SELECT key, fence, acquired_at,
                        lag(fence) OVER w AS prev_fence, lag(ends_at) OVER w AS prev_end
                   FROM grants WINDOW w AS (PARTITION BY key ORDER BY acquired_at, fence)) x
              WHERE prev_fence >= fence OR prev_end > acquired_at",
            &[],
        )
        .unwrap();
    assert!(violations.is_empty(), "{} overlapping or non-increasing grants", violations.len());
}

/// A holder whose lease expires while it sleeps is taken over with a higher fence; its renew then
/// fails with lease-lost (PF001), its release returns false, and the new holder keeps the key.
#[test]
fn an_expired_holder_is_taken_over_and_cannot_renew_or_release() {
    let cluster = Cluster::start("takeover", 26102, &[]);
    let mut a = cluster.connect();
    let mut b = cluster.connect();
    let acquire = |owner| Acquire::new("job", "1 second").owner(owner);

    let a_lease = acquire("A").run(&mut a).expect("the key is free");
    let a_fence = a_lease.fence;
    assert!(acquire("B").run(&mut b).is_none(), "A still holds it");

    wait_until_past(&mut b, a_lease.expires_at);
    let b_fence = acquire("B").run(&mut b).expect("A's lease has expired").fence;
    assert!(b_fence > a_fence, "fence {b_fence} granted after {a_fence}");

    let err = a_lease.renew(&mut a, "1 second").unwrap_err();
    assert_eq!(sqlstate(&err), "PF001", "{err}");
    let released = a_lease.release(&mut a);
    assert!(!released);

    let row = b.query_one("SELECT owner, fence, live FROM fence.leases WHERE key = 'job'", &[]).unwrap();
    assert_eq!(row.get::<_, String>(0), "B");
    assert_eq!(row.get::<_, i64>(1), b_fence);
    assert!(row.get::<_, bool>(2));
}

/// Calls that change nothing (a release with a wrong token, an acquire of a held key) give
/// the key's lock back at once: another role keeping such a call's transaction open does not hold up
/// the holder's renew and release, nor the next grant.
#[test]
fn calls_that_change_nothing_never_hold_up_the_holder() {
    let cluster = Cluster::start("no_stall", 26103, &[]);
    let mut holder = cluster.connect();
    let mut other = cluster.connect();
    holder.batch_execute("SET lock_timeout = '2s'").unwrap();
    let lease = acquire(&mut holder, "k", "1 minute").expect("the key is free");
    let fence = lease.fence;

    // (A renew with a wrong token raises PF001, and the failed transaction holds nothing.)
    let mut open = other.transaction().unwrap();
    let refused = acquire(&mut open, "k", "1 minute");
    assert!(refused.is_none());
    let released: bool =
        open.query_one("SELECT fence.lease_release('k', gen_random_uuid())", &[]).unwrap().get(0);
    assert!(!released);

    // The other session's transaction is still open; the holder goes on unhindered.
    lease.renew(&mut holder, "1 minute").unwrap();
    let released = lease.release(&mut holder);
    assert!(released);
    let next = acquire(&mut holder, "k", "1 minute").expect("the next grant was refused").fence;
    assert!(next > fence, "fence {next} granted after {fence}");
    open.rollback().unwrap();
}

/// Two keys whose public FNV-1a hashes collide (found by a one-core search in 40 s): with locks named
/// by a public hash, whoever held one in an open transaction would hold up the other's holder. With
/// the lock hash keyed by the database's secret, the pair is just two keys.
#[test]
fn keys_with_colliding_public_hashes_do_not_share_a_lock() {
    let cluster = Cluster::start("collision", 26104, &[]);
    let (first, second) = ("job:s3vvE6-lLIJ", "job:QVOjj7kHtmH");
    let mut holder = cluster.connect();
    holder.batch_execute("SET lock_timeout = '2s'").unwrap();
    let lease = acquire(&mut holder, second, "1 minute").expect("the key is free");
    let second_fence = lease.fence;

    let mut other = cluster.connect();
    let mut open = other.transaction().unwrap();
    let granted = acquire(&mut open, first, "1 minute");
    assert!(granted.is_some(), "{first} was taken as {second}");

    // The other key's transaction is open and holds its key lock; the holder goes on unhindered.
    lease.renew(&mut holder, "1 minute").unwrap();
    let released = lease.release(&mut holder);
    assert!(released);
    let next = acquire(&mut holder, second, "1 minute").expect("the next grant was refused").fence;
    assert!(next > second_fence, "fence {next} granted after {second_fence}");
    open.rollback().unwrap();
}

/// `wait => 0` (the default) answers at once: a key that another session's open transaction is
/// granting, or releasing, counts as held, and a key whose expired lease is still being written under
/// (a guard in an open transaction) too. Waiting for such transactions to end could last forever
/// without a statement_timeout.
#[test]
fn an_acquire_without_wait_never_waits() {
    let cluster = Cluster::start("no_wait", 26105, &[]);
    let mut other = cluster.connect();
    let mut client = cluster.connect();
    client.batch_execute("SET statement_timeout = '5s'").unwrap();
    let try_acquire = |client: &mut postgres::Client, key: &str| -> (Option<i64>, std::time::Duration) {
        let started = std::time::Instant::now();
        let lease = Acquire::new(key, "1 minute")
            .try_run(client)
            .map_err(|e| sqlstate(&e))
            .expect("the acquire waited");
        (lease.map(|lease| lease.fence), started.elapsed())
    };

    // Granted in an open transaction.
    let mut open = other.transaction().unwrap();
    acquire(&mut open, "granting", "1 minute");
    let (fence, took) = try_acquire(&mut client, "granting");
    assert_eq!(fence, None);
    assert!(took < Duration::from_secs(2), "took {took:?}");
    open.rollback().unwrap();
    assert!(try_acquire(&mut client, "granting").0.is_some(), "not free again after the rollback");

    // Released in an open transaction: not released until it commits.
    let releasing = acquire(&mut other, "releasing", "1 minute").expect("the key is free");
    let released = releasing.fence;
    let mut open = other.transaction().unwrap();
    releasing.release(&mut open);
    assert_eq!(try_acquire(&mut client, "releasing").0, None);
    open.commit().unwrap();
    let next = try_acquire(&mut client, "releasing").0.expect("not free after the release committed");
    assert!(next > released, "fence {next} granted after {released}");

    // Expired, with a write under its fence still open.
    let written = acquire(&mut other, "written", "200 milliseconds").expect("the key is free");
    let (fence, mut open) = (written.fence, other.transaction().unwrap());
    open.query_one("SELECT fence.fence_guard('written', $1)", &[&fence]).unwrap();
    wait_until_past(&mut client, written.expires_at);
    assert_eq!(try_acquire(&mut client, "written").0, None);
    open.commit().unwrap();
    let next = try_acquire(&mut client, "written").0.expect("not free after the write committed");
    assert!(next > fence, "fence {next} granted after {fence}");
}

/// Calls that can change nothing (a guard without the live fence, a release without the live
/// token) take no lock: however fast a session loops them on a free key, another role's acquires
/// without `wait` of that key are all granted.
#[test]
fn calls_that_change_nothing_hold_up_no_acquire() {
    let cluster = Cluster::start("change_nothing", 26106, &[]);
    cluster
        .connect()
        .batch_execute("CREATE ROLE looper LOGIN; GRANT fence_user TO looper; CREATE ROLE taker LOGIN; GRANT fence_user TO taker")
        .unwrap();
    for (call, what) in [
        ("PERFORM fence.fence_guard('free', 0)", "fence_guard"),
        ("PERFORM fence.lease_release('free', gen_random_uuid())", "lease_release"),
        ("PERFORM fence.lease_renew('free', gen_random_uuid(), '1 s')", "lease_renew"),
    ] {
        let mut looper = cluster.connect_as("looper");
        let looping = format!(
            "DO $$ BEGIN FOR i IN 1..200000 LOOP
                 BEGIN {call}; EXCEPTION WHEN OTHERS THEN NULL; END;
                 EXIT WHEN i % 1000 = 0 AND clock_timestamp() > now() + interval '3 s';
             END LOOP; END $$"
        );
        let looping = thread::spawn(move || looper.batch_execute(&looping).unwrap());
        let mut taker = cluster.connect_as("taker");
        let refused = (0..1_000)
            .filter(|_| match acquire(&mut taker, "free", "1 minute") {
                Some(lease) => !lease.release(&mut taker),
                None => true,
            })
            .count();
        looping.join().unwrap();
        assert_eq!(refused, 0, "{what} in a loop: {refused} of 1,000 acquires of a free key refused");
    }
}

/// Under REPEATABLE READ, a lease granted after the snapshot is invisible to the transaction's
/// statements: its holder's renew and release, and a revoke, fail with 40001 (retry), never
/// "lost" (PF001, false), which would make a live holder stop.
#[test]
fn a_lease_granted_after_a_repeatable_read_snapshot_is_a_serialization_failure() {
    let cluster = Cluster::start("rr_holder", 26107, &[]);
    let mut client = cluster.connect();
    let calls = [
        ("lease_renew", "SELECT fence.lease_renew($1, $2, '1 minute')::text"),
        ("lease_release", "SELECT fence.lease_release($1, $2)::text"),
        ("lease_revoke", "SELECT fence.lease_revoke($1)::text WHERE $2::uuid IS NOT NULL"),
    ];
    for (n, (what, call)) in calls.into_iter().enumerate() {
        let key = format!("rr:{n}");
        let mut old = cluster.connect();
        old.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1").unwrap();
        let lease = acquire(&mut client, &key, "1 hour").expect("the key is free");
        let result = old.query_one(call, &[&key, &lease.token]).map(|row| row.get::<_, Option<String>>(0));
        match result {
            Err(err) => assert_eq!(sqlstate(&err), "40001", "{what}: {err}"),
            Ok(answer) => panic!("{what} answered {answer:?} for a live lease granted after the snapshot"),
        }
        old.batch_execute("ROLLBACK").unwrap();
        let live: bool =
            client.query_one("SELECT live FROM fence.leases WHERE key = $1", &[&key]).unwrap().get(0);
        assert!(live, "{what}: the failed call changed the lease");
    }
}
