//! Shared leases and semaphores (lease_acquire's `shared` and `permits`) from real clients: how
//! many hold a key at once, under racing sessions; fences above every fence told before, in every
//! mode, through kill -9, DROP and CREATE EXTENSION and a failover to an asynchronous standby; a
//! shared holder's guard against the next exclusive grant; FIFO waiting across modes.
use pg_fence_integration::{
    backend_pid, comes_to_wait_on, eventually, set_fence_setting, signal, skipped_on_the_sql_edition,
    sqlstate, wait_event, wait_until_past, Acquire, Cluster, Lease, GUARD_IN_SUBTRANSACTION,
};
use postgres::{Client, NoTls};
use rand::Rng;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// Bounds how long a broken test hangs; never a measure of speed.
const GENEROUS: Duration = Duration::from_secs(60);

/// What a holder does to the resource it holds: counts itself in, under its fence's guard, so that
/// the count is the resource's own view of how many hold it in each mode.
const SCHEMA: &str =
    "CREATE TABLE occupancy (key text PRIMARY KEY, readers int NOT NULL, writers int NOT NULL);
                      INSERT INTO occupancy VALUES ('r', 0, 0)";

/// In one transaction with the guard of `lease`: adds `delta` to the readers (shared) or the writers
/// of key 'r'; returns (readers, writers) after it.
fn occupy(client: &mut Client, lease: &Lease, shared: bool, delta: i32) -> (i32, i32) {
    let mut tx = client.transaction().unwrap();
    tx.query_one("SELECT fence.fence_guard($1, $2)", &[&lease.key, &lease.fence])
        .unwrap_or_else(|err| panic!("the holder of fence {} was refused its guard: {err}", lease.fence));
    let column = if shared { "readers" } else { "writers" };
    let sql =
        format!("UPDATE occupancy SET {column} = {column} + $1 WHERE key = 'r' RETURNING readers, writers");
    let row = tx.query_one(&sql, &[&delta]).unwrap();
    tx.commit().unwrap();
    (row.get(0), row.get(1))
}

#[derive(Default, Debug)]
struct Seen {
    grants: usize,
    shared_grants: usize,
    most_readers: i32,
    most_writers: i32,
    /// (readers, writers) a holder found that its mode forbids.
    violations: Vec<(i32, i32)>,
    fences: Vec<i64>,
}

/// `racers` sessions, each for `duration`: acquires 'r' in the mode `pick` draws (shared, permits),
/// waiting up to a second, counts itself in, holds a few milliseconds, counts itself out, releases.
fn race(
    port: u16,
    racers: usize,
    duration: Duration,
    pick: fn(&mut rand::rngs::ThreadRng) -> (bool, i32),
) -> Seen {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let workers: Vec<_> = (0..racers)
        .map(|_| {
            let seen = Arc::clone(&seen);
            thread::spawn(move || {
                let mut client =
                    Client::connect(&format!("host=127.0.0.1 port={port} user=postgres"), NoTls).unwrap();
                let mut rng = rand::thread_rng();
                let started = Instant::now();
                while started.elapsed() < duration {
                    let (shared, permits) = pick(&mut rng);
                    let acquire =
                        Acquire::new("r", "30 seconds").wait("1 second").shared(shared).permits(permits);
                    let Some(lease) = acquire.run(&mut client) else { continue };
                    let (readers, writers) = occupy(&mut client, &lease, shared, 1);
                    let allowed = if shared { writers == 0 } else { readers == 0 && writers <= permits };
                    thread::sleep(Duration::from_micros(rng.gen_range(0..3000)));
                    occupy(&mut client, &lease, shared, -1);
                    assert!(lease.release(&mut client), "a holder lost its lease (fence {})", lease.fence);
                    let mut seen = seen.lock().unwrap();
                    seen.grants += 1;
                    seen.shared_grants += usize::from(shared);
                    seen.most_readers = seen.most_readers.max(readers);
                    seen.most_writers = seen.most_writers.max(writers);
                    seen.fences.push(lease.fence);
                    if !allowed {
                        seen.violations.push((readers, writers));
                    }
                }
            })
        })
        .collect();
    workers.into_iter().for_each(|worker| worker.join().unwrap());
    let mut seen = std::mem::take(&mut *seen.lock().unwrap());
    let issued = seen.fences.len();
    seen.fences.sort_unstable();
    seen.fences.dedup();
    assert_eq!(seen.fences.len(), issued, "a fence was granted twice");
    seen
}

#[test]
fn shared_leases_live_together_and_never_beside_an_exclusive_one() {
    let cluster = Cluster::start("modes_shared", 27490, &[]);
    cluster.connect().batch_execute(SCHEMA).unwrap();
    let seen = race(cluster.port(), 16, Duration::from_secs(6), |rng| (rng.gen_bool(0.8), 1));
    println!("16 racers, shared and exclusive: {seen:?}");
    assert!(seen.violations.is_empty(), "holders found another mode beside them: {:?}", seen.violations);
    assert!(seen.most_readers >= 2, "shared leases never lived together: {seen:?}");
    assert_eq!(seen.most_writers, 1, "{seen:?}");
    assert!(seen.grants - seen.shared_grants >= 5, "too few exclusive grants to prove anything: {seen:?}");
}

#[test]
fn a_semaphore_of_three_never_has_a_fourth_holder() {
    let cluster = Cluster::start("modes_semaphore", 27491, &[]);
    let mut client = cluster.connect();
    client.batch_execute(SCHEMA).unwrap();
    let seen = race(cluster.port(), 16, Duration::from_secs(5), |_| (false, 3));
    println!("16 racers, permits => 3: {seen:?}");
    assert!(seen.violations.is_empty(), "more than 3 holders at once: {:?}", seen.violations);
    assert_eq!(seen.most_writers, 3, "the semaphore never filled: {seen:?}");

    // Callers that disagree about the size: never more holders than the smallest live count.
    let five = |client: &mut Client| Acquire::new("s", "1 hour").permits(5).run(client);
    let two = |client: &mut Client| Acquire::new("s", "1 hour").permits(2).run(client);
    let first = five(&mut client).expect("a semaphore of 5 is free");
    let second = two(&mut client).expect("one holder of 5 leaves room for a semaphore of 2");
    assert!(two(&mut client).is_none(), "a third holder beside one granted under permits => 2");
    assert!(five(&mut client).is_none(), "a third holder beside one granted under permits => 2");
    assert!(Acquire::new("s", "1 hour").run(&mut client).is_none(), "an exclusive lease beside two");
    assert!(Acquire::new("s", "1 hour").shared(true).run(&mut client).is_none(), "shared beside a semaphore");
    assert!(second.release(&mut client));
    let third = five(&mut client).expect("room again for a semaphore of 5");
    assert!(third.fence > second.fence && second.fence > first.fence);
}

/// Leases of every mode on key `key` granted, held together where the mode allows, and released;
/// the fences recorded in `issued`. Short leases: a release is not flushed (it needs not survive a
/// crash), so after kill -9 a lease may be back, until its TTL.
fn grant_every_mode(client: &mut Client, key: &str, durable: bool, issued: &mut Vec<(String, i64)>) {
    for (shared, permits) in [(false, 1), (true, 1), (false, 3)] {
        let acquire = Acquire::new(key, "5 seconds").durable(durable).shared(shared).permits(permits);
        let holders: Vec<Lease> = (0..if permits == 1 && !shared { 1 } else { 2 })
            .map(|_| {
                acquire.run(client).unwrap_or_else(|| panic!("{key}: no room in mode {shared}/{permits}"))
            })
            .collect();
        for lease in holders {
            issued.push((key.to_string(), lease.fence));
            assert!(lease.release(client));
        }
    }
}

/// On the server after a fault: every key granted once in every mode, each above every fence told
/// for it before.
fn every_mode_above(client: &mut Client, issued: &[(String, i64)]) -> usize {
    let mut reissued = 0;
    let keys: std::collections::BTreeSet<&str> = issued.iter().map(|(key, _)| key.as_str()).collect();
    for key in keys {
        let told = issued.iter().filter(|(k, _)| k == key).map(|(_, fence)| *fence).max().unwrap();
        for (shared, permits, durable) in
            [(false, 1, true), (true, 1, true), (false, 3, true), (true, 1, false), (false, 3, false)]
        {
            let acquire = Acquire::new(key, "1 hour")
                .wait("30 seconds")
                .shared(shared)
                .permits(permits)
                .durable(durable);
            let lease = acquire.run(client).unwrap_or_else(|| panic!("{key} still held after 30 s"));
            reissued += usize::from(lease.fence <= told);
            assert!(lease.release(client));
        }
    }
    reissued
}

#[test]
fn every_mode_is_granted_above_every_fence_after_drop_create_and_kill_9() {
    let cluster = Cluster::start("modes_histories", 27492, &[]);
    let mut client = cluster.connect();
    let mut issued = Vec::new();
    grant_every_mode(&mut client, "durable", true, &mut issued);
    grant_every_mode(&mut client, "fast", false, &mut issued);
    client.batch_execute("DROP EXTENSION pg_fence; CREATE EXTENSION pg_fence").unwrap();
    let mut client = cluster.connect();
    assert_eq!(every_mode_above(&mut client, &issued), 0, "a grant after DROP/CREATE reissued a fence");

    let mut issued = Vec::new();
    grant_every_mode(&mut client, "durable", true, &mut issued);
    grant_every_mode(&mut client, "fast", false, &mut issued);
    drop(client);
    cluster.crash();
    cluster.restart();
    let mut client = cluster.connect();
    let fast_rows: i64 = client.query_one("SELECT count(*) FROM fence.fast_lease_state", &[]).unwrap().get(0);
    assert_eq!(fast_rows, 0, "the crash kept the fast leases' rows, proving nothing");
    assert_eq!(
        every_mode_above(&mut client, &issued),
        0,
        "a grant after kill -9 reissued a fence: {issued:?}"
    );
}

#[test]
fn every_mode_is_granted_above_every_fence_after_failover_to_an_asynchronous_standby() {
    let primary = Cluster::start("modes_failover", 27493, &[]);
    let standby = Cluster::start_standby("modes_failover_standby", &primary, 27494, &[]);
    let mut client = primary.connect();
    let mut issued = Vec::new();
    grant_every_mode(&mut client, "replicated", true, &mut issued);
    standby.wait_until_replayed(&mut client);
    // The standby stops receiving: what follows is lost with the primary.
    let walreceiver = standby.walreceiver_pid();
    signal(walreceiver, "-STOP");
    let mut lost = Vec::new();
    grant_every_mode(&mut client, "lost", true, &mut lost);
    grant_every_mode(&mut client, "replicated", false, &mut lost);
    drop(client);
    primary.crash();
    signal(walreceiver, "-KILL");
    standby.wait_until_ready();
    standby.promote();
    let mut promoted = standby.connect();
    issued.extend(lost);
    let lost_known: Option<i64> =
        promoted.query_one("SELECT fence.current_fence('lost')", &[]).unwrap().get(0);
    assert_eq!(lost_known, None, "the standby received the grants it should have lost, proving nothing");
    assert_eq!(every_mode_above(&mut promoted, &issued), 0, "a grant after failover reissued a fence");
}

/// An exclusive acquire of `key` on `writer` (durable or fast) comes to wait, and is still waiting
/// a moment later, until `end_write` has ended the writing transaction; then it is granted.
fn exclusive_waits_for_the_write(
    observer: &mut Client,
    mut writer: Client,
    key: &'static str,
    durable: bool,
    end_write: impl FnOnce(),
) -> (Lease, Client) {
    let writer_pid = backend_pid(&mut writer);
    let exclusive = thread::spawn(move || {
        let lease = Acquire::new(key, "1 minute").durable(durable).wait("30 seconds").run(&mut writer);
        (lease, writer)
    });
    assert!(
        comes_to_wait_on(observer, writer_pid, "Lock"),
        "{key}: the exclusive grant did not wait for the guard"
    );
    thread::sleep(Duration::from_millis(300));
    assert!(!exclusive.is_finished(), "{key}: the exclusive grant went ahead of the guarded write");
    end_write();
    let (granted, writer) = exclusive.join().unwrap();
    (granted.expect("the exclusive acquirer was never granted"), writer)
}

/// Invariant 3 for a shared holder: its guard, taken in a savepoint that rolls back, still holds
/// back the next exclusive grant until the writing transaction ends; shared grants do not wait.
#[test]
fn a_shared_holders_guard_in_a_rolled_back_savepoint_holds_back_the_exclusive_grant() {
    if skipped_on_the_sql_edition(GUARD_IN_SUBTRANSACTION) {
        return;
    }
    let cluster = Cluster::start("modes_guard", 27495, &[]);
    let (mut holder, mut reader, writer, mut observer) =
        (cluster.connect(), cluster.connect(), cluster.connect(), cluster.connect());
    holder.batch_execute("CREATE TABLE res (id int PRIMARY KEY, value text, fence bigint); INSERT INTO res VALUES (1, 'new', 0)").unwrap();
    let lease = Acquire::new("g", "2 seconds").shared(true).run(&mut holder).expect("g is free");
    let mut tx = holder.transaction().unwrap();
    tx.batch_execute("SAVEPOINT s").unwrap();
    tx.query_one("SELECT fence.fence_guard('g', $1)", &[&lease.fence]).unwrap();
    tx.batch_execute("ROLLBACK TO SAVEPOINT s").unwrap();
    tx.execute("UPDATE res SET value = 'by the shared holder', fence = $1 WHERE id = 1", &[&lease.fence])
        .unwrap();
    // Another reader comes in at once, beside the guard.
    let other = Acquire::new("g", "1 second")
        .shared(true)
        .run(&mut reader)
        .expect("a shared grant waited for a guard");
    assert!(other.release(&mut reader));
    // Once the shared lease has expired, an exclusive acquirer must wait for the guarded write.
    wait_until_past(&mut observer, lease.expires_at);
    let (granted, _writer) =
        exclusive_waits_for_the_write(&mut observer, writer, "g", true, || tx.commit().unwrap());
    assert!(granted.fence > other.fence && other.fence > lease.fence);
    let value: String = observer.query_one("SELECT value FROM res WHERE id = 1", &[]).unwrap().get(0);
    assert_eq!(value, "by the shared holder");
}

/// Invariant 3 against the sweep: the row of an ended shared lease (or semaphore permit) is what
/// makes the next exclusive grant wait for the writers under it. With pg_fence.retain_ended = 0 the
/// sweep would delete it while a writer's transaction is still open, and the exclusive grant would
/// commit before that write: it keeps the row until the writer has ended. Durable and fast (in the
/// fast table, and in shared memory where the suite runs again with it).
#[test]
fn the_sweep_keeps_an_ended_lease_whose_writer_is_still_open() {
    let cluster = Cluster::start("modes_swept", 27497, &[]);
    let (mut holder, mut sweeper, mut writer, mut observer) =
        (cluster.connect(), cluster.connect(), cluster.connect(), cluster.connect());
    set_fence_setting(&mut sweeper, "retain_ended", "0");
    for (key, durable, shared) in
        [("sd", true, true), ("sf", false, true), ("pd", true, false), ("pf", false, false)]
    {
        let acquire = Acquire::new(key, "1 second").durable(durable);
        let acquire = if shared { acquire.shared(true) } else { acquire.permits(2) };
        // A permit in slot 1, whose guard lock is not the key's own (slot 0's is, and every grant
        // takes that): the first permit is released.
        let first = (!shared).then(|| acquire.run(&mut holder).expect("the key is free"));
        let lease = acquire.run(&mut holder).expect("the key is free");
        if let Some(first) = first {
            assert!(first.release(&mut holder));
        }
        let mut tx = holder.transaction().unwrap();
        tx.query_one("SELECT fence.fence_guard($1, $2)", &[&key, &lease.fence]).unwrap();
        wait_until_past(&mut observer, lease.expires_at);
        // The first sweep marks the lease ended; the next ones would delete its row.
        for _ in 0..3 {
            sweeper.query_one("SELECT fence.sweep()", &[]).unwrap();
        }
        let kept: Option<i64> = observer.query_one("SELECT fence.current_fence($1)", &[&key]).unwrap().get(0);
        assert_eq!(
            kept,
            Some(lease.fence),
            "{key}: the sweep deleted the row of a lease with an open writer"
        );

        let (granted, back) =
            exclusive_waits_for_the_write(&mut observer, writer, key, durable, || tx.commit().unwrap());
        writer = back;
        assert!(granted.fence > lease.fence);
        assert!(granted.release(&mut writer));
    }
    // With no writer left, the sweep deletes the ended rows.
    for _ in 0..2 {
        sweeper.query_one("SELECT fence.sweep()", &[]).unwrap();
    }
    let left: i64 = observer.query_one("SELECT count(*) FROM fence.leases", &[]).unwrap().get(0);
    assert_eq!(left, 0, "the rows of ended leases without writers stayed");
}

/// A writer frozen in its transaction under an ended permit (a holder stopped between its guard and
/// its commit) holds back the grant of that permit's slot only: a grant that another free slot
/// leaves room for takes that slot at once; a grant waiting for the frozen writer holds up no live
/// permit's renewal or release, and takes a permit released meanwhile; the frozen permit's slot is
/// granted once its writer has ended. Durable and fast.
#[test]
fn a_writer_frozen_under_an_ended_permit_holds_back_only_its_own_slot() {
    let cluster = Cluster::start("modes_frozen_permit", 27498, &[]);
    let (mut holder, mut writer, mut taker, mut waiter, mut observer) =
        (cluster.connect(), cluster.connect(), cluster.connect(), cluster.connect(), cluster.connect());
    // Bounds a renewal held up by the waiting grant (its wait is 30 s): an error, not a hang.
    taker.batch_execute("SET statement_timeout = '10s'").unwrap();
    for (key, durable) in [("pd", true), ("pf", false)] {
        let permit = move |ttl: &'static str| Acquire::new(key, ttl).durable(durable).permits(2);
        let first = permit("1 second").run(&mut holder).expect("the key is free");
        let second =
            permit("1 second").run(&mut holder).expect("a semaphore of 2 has room for a second permit");
        let mut tx = writer.transaction().unwrap();
        tx.query_one("SELECT fence.fence_guard($1, $2)", &[&key, &first.fence]).unwrap();
        wait_until_past(&mut observer, first.expires_at.max(second.expires_at));

        let taken = permit("1 minute").run(&mut taker).unwrap_or_else(|| {
            panic!("{key}: a free permit was refused while a writer under another ended permit was open")
        });
        assert!(taken.fence > second.fence, "{key}: a grant below a fence told before");
        let refused = permit("1 minute").run(&mut taker);
        assert!(refused.is_none(), "{key}: the frozen writer's permit was granted while it was open");

        let waiter_pid = backend_pid(&mut waiter);
        let waiting = thread::spawn(move || (permit("1 minute").wait("30 seconds").run(&mut waiter), waiter));
        let waits = |observer: &mut Client| {
            matches!(wait_event(observer, waiter_pid).0.as_deref(), Some("Extension" | "Lock"))
        };
        assert!(
            eventually(GENEROUS, || waits(&mut observer)),
            "{key}: the grant of the frozen writer's permit did not wait"
        );
        taken.renew(&mut taker, "1 minute").unwrap_or_else(|err| {
            panic!(
                "{key}: a live permit's renewal waited for a grant waiting for a frozen writer: {}",
                sqlstate(&err)
            )
        });
        assert!(!waiting.is_finished(), "{key}: the frozen writer's permit was granted while it was open");
        assert!(taken.release(&mut taker), "{key}: the live permit was lost");
        let (last, back) = waiting.join().unwrap();
        waiter = back;
        let last =
            last.unwrap_or_else(|| panic!("{key}: a permit released while a grant waited never went to it"));
        assert!(last.fence > taken.fence, "{key}: a grant below a fence told before");

        tx.commit().unwrap();
        let after = permit("1 minute").run(&mut taker).unwrap_or_else(|| {
            panic!("{key}: the frozen writer's permit was not granted once its writer had ended")
        });
        assert!(after.fence > last.fence, "{key}: a grant below a fence told before");
        assert!(last.release(&mut waiter) && after.release(&mut taker));
    }
}

/// FIFO across modes: while an exclusive acquirer waits, later shared acquirers queue behind it
/// (a shared `wait => 0` acquire gets NULL), and a released lease wakes the head waiter at once.
#[test]
fn later_shared_acquirers_queue_behind_a_waiting_exclusive_one() {
    let cluster = Cluster::start("modes_fifo", 27496, &[]);
    let (mut first, mut exclusive, mut later, mut observer) =
        (cluster.connect(), cluster.connect(), cluster.connect(), cluster.connect());
    let reader = Acquire::new("q", "1 hour").shared(true).run(&mut first).expect("q is free");
    let exclusive_pid = backend_pid(&mut exclusive);
    let order = Arc::new(Mutex::new(Vec::new()));
    let waiter =
        |mut client: Client, shared: bool, name: &'static str, order: Arc<Mutex<Vec<&'static str>>>| {
            thread::spawn(move || {
                let lease = Acquire::new("q", "1 hour").wait("30 seconds").shared(shared).run(&mut client);
                let lease = lease.unwrap_or_else(|| panic!("{name} was never granted"));
                order.lock().unwrap().push(name);
                thread::sleep(Duration::from_millis(300));
                assert!(lease.release(&mut client));
            })
        };
    let exclusive = waiter(exclusive, false, "exclusive", Arc::clone(&order));
    assert!(
        comes_to_wait_on(&mut observer, exclusive_pid, "Extension"),
        "the exclusive acquirer did not wait"
    );
    let refused = Acquire::new("q", "1 hour").shared(true).run(&mut later);
    assert!(refused.is_none(), "a shared wait => 0 acquire went ahead of the waiting exclusive one");
    let later_pid = backend_pid(&mut later);
    let later = waiter(later, true, "later reader", Arc::clone(&order));
    assert!(comes_to_wait_on(&mut observer, later_pid, "Lock"), "the later reader did not queue");
    let released_at = Instant::now();
    assert!(reader.release(&mut first));
    exclusive.join().unwrap();
    later.join().unwrap();
    assert_eq!(*order.lock().unwrap(), ["exclusive", "later reader"]);
    assert!(released_at.elapsed() < GENEROUS);
}
