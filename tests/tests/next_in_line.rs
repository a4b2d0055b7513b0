//! A release that grants the key to the first waiter in its own transaction (src/leases/next_in_line.rs),
//! on clusters with pg_fence preloaded: the grant is made and seen in the release's transaction, and
//! undone with it; a waiter whose wait runs out meanwhile waits for that transaction's outcome and
//! walks away from no grant made for it; the waiter's session, kind and mode are its own; the
//! handed grant survives a crash; the queue keeps its order. `pg_fence.hand_off_in_release = off`
//! is the path without it, for the comparisons that show each test can fail.
use pg_fence_integration::{acquire, backend_pid, eventually, wait_event, Acquire, Cluster, Lease};
use postgres::Client;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Bounds how long a broken test hangs; never a measure of speed.
const GENEROUS: Duration = Duration::from_secs(20);

fn preloaded(name: &str, port: u16) -> Cluster {
    Cluster::start(name, port, &["shared_preload_libraries=pg_fence", "pg_fence.hand_off_in_release=on"])
}

type Waiting = JoinHandle<(Client, Option<Lease>)>;

/// Runs `call` (an acquire with `wait`) on its own connection, in a thread; returns its backend's
/// pid once it waits as the first in line.
fn first_in_line(cluster: &Cluster, observer: &mut Client, call: Acquire<'static>) -> (i32, Waiting) {
    let mut client = cluster.connect();
    let pid = backend_pid(&mut client);
    let handle = thread::spawn(move || {
        let lease = call.run(&mut client);
        (client, lease)
    });
    assert!(eventually(GENEROUS, || sleeping(observer, pid)), "the waiter never went to sleep");
    (pid, handle)
}

/// First in line: asleep on its latch inside lease_acquire.
fn sleeping(observer: &mut Client, pid: i32) -> bool {
    wait_event(observer, pid).0.as_deref() == Some("Extension")
}

/// The key's live lease as the client's own transaction sees it: (owner, fence).
fn holder(client: &mut Client, key: &str) -> Option<(String, i64)> {
    client
        .query_opt("SELECT owner, fence FROM fence.leases WHERE key = $1 AND live", &[&key])
        .unwrap()
        .map(|row| (row.get(0), row.get(1)))
}

/// Releases `lease` in a statement of its own (a DO block, autocommit), which then records the
/// key's live holder as it sees it, sleeps `then_sleep` seconds, and raises an error if `fail`:
/// the holder it saw, or None when it failed.
fn release_alone(client: &mut Client, lease: &Lease, then_sleep: f64, fail: bool) -> Option<(String, i64)> {
    client
        .batch_execute("CREATE TEMP TABLE IF NOT EXISTS seen (owner text, fence bigint); TRUNCATE seen")
        .unwrap();
    let block = format!(
        "DO $$ BEGIN
            PERFORM fence.lease_release('{key}', '{token}');
            INSERT INTO seen SELECT owner, fence FROM fence.leases WHERE key = '{key}' AND live;
            PERFORM pg_sleep({then_sleep});
            IF {fail} THEN RAISE EXCEPTION 'the release fails'; END IF;
         END $$",
        key = lease.key,
        token = lease.token
    );
    let result = client.batch_execute(&block);
    assert_eq!(result.is_err(), fail, "{result:?}");
    if fail {
        return None;
    }
    client
        .query_opt("SELECT owner, fence FROM seen ORDER BY fence DESC LIMIT 1", &[])
        .unwrap()
        .map(|row| (row.get(0), row.get(1)))
}

/// The release grants the key to the waiter in the release's own transaction: that transaction
/// sees the waiter's lease, with a higher fence, before it ends; the waiter returns it once the
/// release commits, with its own token, and its acquired_at is the release's. With the setting off,
/// the release only ends the lease (the test's own check that it can fail).
#[test]
fn a_release_grants_the_key_to_the_first_in_line_in_its_own_transaction() {
    let cluster = preloaded("next_grant", 27660);
    let (mut holder_client, mut observer) = (cluster.connect(), cluster.connect());
    for hand_off in [true, false] {
        let key = if hand_off { "handed" } else { "woken" };
        holder_client.batch_execute(&format!("SET pg_fence.hand_off_in_release = {hand_off}")).unwrap();
        let held = acquire(&mut holder_client, key, "1 minute").expect("the key is free");
        let (_, waiting) = first_in_line(
            &cluster,
            &mut observer,
            Acquire::new(key, "1 minute").owner("next").wait("30 seconds"),
        );
        let seen_in_release = release_alone(&mut holder_client, &held, 0.0, false);
        let (mut client, granted) = waiting.join().unwrap();
        let granted = granted.expect("the waiter was not granted the key");
        assert!(granted.fence > held.fence, "fence {} after {}", granted.fence, held.fence);
        if hand_off {
            assert_eq!(
                seen_in_release,
                Some(("next".to_string(), granted.fence)),
                "not granted in the release"
            );
        } else {
            assert_eq!(seen_in_release, None, "granted in the release with the setting off");
        }
        granted.renew(&mut client, "1 minute").expect("the waiter's own token does not hold the lease");
        assert!(granted.release(&mut client));
    }
}

/// Only calls that are whole transactions take part: a release in a transaction block, or a waiter
/// in one, is served as before, and the waiter's ROLLBACK undoes its grant.
#[test]
fn calls_in_transaction_blocks_do_not_take_part() {
    let cluster = preloaded("next_blocks", 27666);
    let (mut holder_client, mut observer) = (cluster.connect(), cluster.connect());
    let held = acquire(&mut holder_client, "b", "1 minute").unwrap();
    let (_, waiting) = first_in_line(
        &cluster,
        &mut observer,
        Acquire::new("b", "1 minute").owner("next").wait("30 seconds"),
    );
    holder_client.batch_execute("BEGIN").unwrap();
    assert!(held.release(&mut holder_client));
    assert_eq!(holder(&mut holder_client, "b"), None, "a release in a transaction block handed the key");
    holder_client.batch_execute("COMMIT").unwrap();
    assert!(waiting.join().unwrap().1.is_some_and(|lease| lease.release(&mut holder_client)));

    let held = acquire(&mut holder_client, "b", "1 minute").unwrap();
    let mut client = cluster.connect();
    let pid = backend_pid(&mut client);
    let waiting = thread::spawn(move || {
        client.batch_execute("BEGIN").unwrap();
        let lease = Acquire::new("b", "1 minute").wait("30 seconds").run(&mut client);
        client.batch_execute("ROLLBACK").unwrap();
        lease
    });
    assert!(eventually(GENEROUS, || sleeping(&mut observer, pid)), "the waiter never went to sleep");
    assert!(
        release_alone(&mut holder_client, &held, 0.0, false).is_none(),
        "a waiter in a block was handed the key"
    );
    assert!(waiting.join().unwrap().is_some(), "the waiter was not granted the key");
    assert_eq!(holder(&mut observer, "b"), None, "the waiter's ROLLBACK did not undo its grant");
}

/// A release whose statement fails grants nothing: the waiter keeps waiting, the holder keeps the
/// key; the release that commits grants it.
#[test]
fn a_release_rolled_back_grants_nothing() {
    let cluster = preloaded("next_rollback", 27661);
    let (mut holder_client, mut observer) = (cluster.connect(), cluster.connect());
    let held = acquire(&mut holder_client, "k", "1 minute").unwrap();
    let (pid, waiting) =
        first_in_line(&cluster, &mut observer, Acquire::new("k", "1 minute").owner("next").wait("1 minute"));
    release_alone(&mut holder_client, &held, 0.0, true);
    assert!(eventually(GENEROUS, || sleeping(&mut observer, pid)), "the waiter stopped waiting");
    assert!(!waiting.is_finished(), "granted by a release that was rolled back");
    assert_eq!(
        holder(&mut observer, "k").map(|(_, fence)| fence),
        Some(held.fence),
        "the holder lost the key"
    );
    held.renew(&mut holder_client, "1 minute").expect("the holder lost the key to a rolled-back release");
    assert!(release_alone(&mut holder_client, &held, 0.0, false).is_some());
    let granted = waiting.join().unwrap().1.expect("not granted by the release that committed");
    assert!(granted.fence > held.fence);
}

/// A waiter whose wait runs out while the release that chose it is still running waits for that
/// release's outcome: committed, the lease is its answer (nothing is left behind under a token
/// nobody has); failed, NULL, and the key is the holder's.
#[test]
fn a_wait_that_runs_out_during_the_release_takes_its_outcome() {
    let cluster = preloaded("next_deadline", 27662);
    let (mut holder_client, mut observer) = (cluster.connect(), cluster.connect());
    for commit in [true, false] {
        let key = if commit { "committed" } else { "rolled back" };
        let held = acquire(&mut holder_client, key, "1 minute").unwrap();
        let started = Instant::now();
        let (_, waiting) = first_in_line(
            &cluster,
            &mut observer,
            Acquire::new(key, "1 minute").owner("next").wait("2 seconds"),
        );
        let sleep = 3.0 - started.elapsed().as_secs_f64();
        release_alone(&mut holder_client, &held, sleep, !commit);
        let (_, granted) = waiting.join().unwrap();
        let now_held = holder(&mut observer, key);
        if commit {
            let granted = granted.expect("the release's grant was walked away from");
            assert_eq!(now_held, Some(("next".to_string(), granted.fence)));
        } else {
            assert!(granted.is_none(), "granted by a release that was rolled back");
            assert_eq!(now_held.map(|(_, fence)| fence), Some(held.fence), "the holder lost the key");
            assert!(held.release(&mut holder_client));
        }
    }
}

/// Two releases of a semaphore's permits in quick succession hand one permit to the first waiter,
/// not two: the second release finds the post granted already, and the next waiter gets its permit.
#[test]
fn a_waiter_is_handed_one_permit() {
    let cluster = preloaded("next_permits", 27667);
    let (mut holder_client, mut observer) = (cluster.connect(), cluster.connect());
    let permit = |owner: &'static str| Acquire::new("sem", "1 minute").permits(2).owner(owner);
    let (a, b) = (permit("a").run(&mut holder_client).unwrap(), permit("b").run(&mut holder_client).unwrap());
    let (_, first) = first_in_line(&cluster, &mut observer, permit("w1").wait("30 seconds"));
    let mut second_client = cluster.connect();
    let second_pid = backend_pid(&mut second_client);
    let second = thread::spawn(move || permit("w2").wait("30 seconds").run(&mut second_client));
    assert!(
        eventually(GENEROUS, || wait_event(&mut observer, second_pid).0.as_deref() == Some("Lock")),
        "the second waiter never queued"
    );
    let mut other = cluster.connect();
    let other_release = thread::spawn(move || {
        thread::sleep(Duration::from_millis(200));
        assert!(b.release(&mut other));
    });
    release_alone(&mut holder_client, &a, 0.5, false);
    other_release.join().unwrap();
    let first = first.join().unwrap().1.expect("the first waiter got no permit");
    let second = second.join().unwrap().expect("the second waiter got no permit");
    let holders: Vec<String> = observer
        .query("SELECT owner FROM fence.leases WHERE key = 'sem' AND live ORDER BY owner", &[])
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(holders, ["w1", "w2"], "fences {} and {}", first.fence, second.fence);
}

/// The handed lease is the waiter's own kind, mode and session: a session-bound waiter's lease
/// ends with the waiter's session, not the releaser's; a fast waiter gets a fast lease after a
/// durable one; a shared waiter a shared lease.
#[test]
fn the_handed_lease_is_the_waiters_own() {
    let cluster = preloaded("next_own", 27663);
    let (mut holder_client, mut observer) = (cluster.connect(), cluster.connect());

    let held = acquire(&mut holder_client, "bound", "1 minute").unwrap();
    let call = Acquire::new("bound", "1 minute").session_bound(true).wait("30 seconds");
    let (pid, waiting) = first_in_line(&cluster, &mut observer, call);
    assert!(held.release(&mut holder_client));
    let (client, granted) = waiting.join().unwrap();
    let granted = granted.expect("not granted");
    let session: Option<i32> = observer
        .query_one("SELECT session_pid FROM fence.leases WHERE key = 'bound' AND live", &[])
        .unwrap()
        .get(0);
    assert_eq!(session, Some(pid), "bound to another session than the waiter's");
    drop(client);
    assert!(
        eventually(GENEROUS, || holder(&mut observer, "bound").is_none()),
        "the lease outlived the waiter's session"
    );
    assert!(acquire(&mut holder_client, "bound", "1 minute").is_some_and(|lease| lease.fence > granted.fence));

    let held = acquire(&mut holder_client, "kinds", "1 minute").unwrap();
    let call = Acquire::new("kinds", "1 minute").durable(false).shared(true).wait("30 seconds");
    let (_, waiting) = first_in_line(&cluster, &mut observer, call);
    assert!(held.release(&mut holder_client));
    let (_, granted) = waiting.join().unwrap();
    let granted = granted.expect("not granted");
    let (durable, shared): (bool, bool) = observer
        .query_one("SELECT durable, shared FROM fence.leases WHERE key = 'kinds' AND live", &[])
        .map(|row| (row.get(0), row.get(1)))
        .unwrap();
    assert!(!durable && shared, "handed a lease of another kind or mode: durable {durable}, shared {shared}");
    assert!(granted.fence > held.fence);
}

/// The handed grant is durable as the waiter's own would be: after the waiter has it, a crash
/// (kill -9 of the postmaster) and a restart keep it.
#[test]
fn the_handed_grant_survives_a_crash() {
    let cluster = preloaded("next_crash", 27664);
    let (mut holder_client, mut observer) = (cluster.connect(), cluster.connect());
    let held = acquire(&mut holder_client, "kept", "1 hour").unwrap();
    let (_, waiting) = first_in_line(
        &cluster,
        &mut observer,
        Acquire::new("kept", "1 hour").owner("next").wait("30 seconds"),
    );
    assert!(held.release(&mut holder_client));
    let granted = waiting.join().unwrap().1.expect("not granted");
    cluster.crash();
    cluster.restart();
    let mut client = cluster.connect();
    assert_eq!(holder(&mut client, "kept"), Some(("next".to_string(), granted.fence)), "the grant was lost");
    granted.renew(&mut client, "1 hour").expect("the waiter's token does not hold the lease");
}

/// Eight queued waiters, each releasing as soon as it is granted: each release hands the key to the
/// next in arrival order, and fences rise along the queue.
#[test]
fn the_queue_keeps_its_order() {
    let cluster = preloaded("next_fifo", 27665);
    let (mut holder_client, mut observer) = (cluster.connect(), cluster.connect());
    let held = acquire(&mut holder_client, "fifo", "1 minute").unwrap();
    let mut handles = Vec::new();
    for i in 0..8 {
        let mut client = cluster.connect();
        let pid = backend_pid(&mut client);
        handles.push(thread::spawn(move || {
            let lease =
                Acquire::new("fifo", "1 minute").wait("1 minute").run(&mut client).expect("not granted");
            assert!(lease.release(&mut client));
            lease.fence
        }));
        let in_line = |observer: &mut Client| {
            let event = wait_event(observer, pid);
            if i == 0 {
                event.0.as_deref() == Some("Extension")
            } else {
                event == (Some("Lock".into()), Some("advisory".into()))
            }
        };
        assert!(eventually(GENEROUS, || in_line(&mut observer)), "waiter {i} never got in line");
    }
    assert!(held.release(&mut holder_client));
    let fences: Vec<i64> = handles.into_iter().map(|handle| handle.join().unwrap()).collect();
    let in_grant_order = std::iter::once(&held.fence).chain(&fences).collect::<Vec<_>>();
    assert!(
        in_grant_order.windows(2).all(|pair| pair[0] < pair[1]),
        "out of arrival order: {in_grant_order:?}"
    );
}
