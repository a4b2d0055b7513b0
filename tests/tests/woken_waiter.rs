//! A waiter woken by a release grants itself the key, in its own call and transaction
//! (src/leases/line/waiting.rs), on clusters with pg_fence preloaded: the release's transaction never
//! sees the waiter's lease, and a waiter whose call fails (cancelled, its lock_timeout or its wait
//! run out while the release runs, its statement failing after the acquire returned) leaves
//! nothing granted; a release rolled back wakes nobody; the queue keeps its order.
use pg_fence_integration::{acquire, backend_pid, eventually, sqlstate, wait_event, Acquire, Cluster, Lease};
use postgres::Client;
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// Bounds how long a broken test hangs; never a measure of speed.
const GENEROUS: Duration = Duration::from_secs(20);

/// pg_fence preloaded: the board of waiters' requests in shared memory, which a release used to
/// grant the first waiter from, would be there.
fn preloaded(name: &str, port: u16) -> Cluster {
    Cluster::start(name, port, &["shared_preload_libraries=pg_fence"])
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

/// The release only ends the lease: its own transaction, to its end, sees no holder of the key; the
/// waiter then grants itself, with a higher fence and its own token.
#[test]
fn the_waiter_grants_itself_after_the_release_commits() {
    let cluster = preloaded("woken_grant", 27660);
    let (mut holder_client, mut observer) = (cluster.connect(), cluster.connect());
    let held = acquire(&mut holder_client, "k", "1 minute").expect("the key is free");
    let (_, waiting) = first_in_line(
        &cluster,
        &mut observer,
        Acquire::new("k", "1 minute").owner("next").wait("30 seconds"),
    );
    let seen_in_release = release_alone(&mut holder_client, &held, 0.0, false);
    assert_eq!(seen_in_release, None, "the release's own transaction saw the key granted");
    let (mut client, granted) = waiting.join().unwrap();
    let granted = granted.expect("the waiter was not granted the key");
    assert!(granted.fence > held.fence, "fence {} after {}", granted.fence, held.fence);
    granted.renew(&mut client, "1 minute").expect("the waiter's own token does not hold the lease");
    assert!(granted.release(&mut client));
}

/// How a waiter's call fails while the release that frees the key runs, or after it returned.
#[derive(Clone, Copy, Debug)]
enum Failure {
    /// pg_cancel_backend while the release's transaction is still open: 57014.
    Cancel,
    /// Its wait runs out while the release's transaction is open, with a lock_timeout shorter than
    /// what is left of that transaction: NULL, or 55P03.
    WaitRunsOut,
    /// Its autocommit statement fails after lease_acquire returned (a division by zero): 22012.
    StatementFails,
}

/// A waiter whose call fails leaves nothing granted: once the release has committed, the key is
/// free for anyone. (A release that granted the first waiter in its own transaction left the key
/// to a caller that never received it, for its TTL.)
#[test]
fn a_waiter_whose_call_fails_leaves_nothing_granted() {
    let cluster = preloaded("woken_failed", 27662);
    let (mut holder_client, mut observer) = (cluster.connect(), cluster.connect());
    let mut left_granted = Vec::new();
    for failure in [Failure::Cancel, Failure::WaitRunsOut, Failure::StatementFails] {
        let key = format!("{failure:?}");
        let held = acquire(&mut holder_client, &key, "1 hour").expect("the key is free");
        let mut client = cluster.connect();
        let pid = backend_pid(&mut client);
        let (wait, then_sleep) = match failure {
            Failure::WaitRunsOut => ("1 second", 2.0),
            _ => ("30 seconds", 1.5),
        };
        if let Failure::WaitRunsOut = failure {
            client.batch_execute("SET lock_timeout = '200ms'").unwrap();
        }
        let sql = format!(
            "SELECT (fence.lease_acquire($1, '1 hour', wait => '{wait}')).fence / {}",
            if let Failure::StatementFails = failure { 0 } else { 1 }
        );
        let waiter_key = key.clone();
        let waiting = thread::spawn(move || {
            client
                .query_one(&sql, &[&waiter_key])
                .map(|row| row.get::<_, Option<i64>>(0))
                .map_err(|e| sqlstate(&e))
        });
        assert!(eventually(GENEROUS, || sleeping(&mut observer, pid)), "the waiter never went to sleep");
        let release = {
            let mut releaser = cluster.connect();
            let held = held.clone();
            thread::spawn(move || release_alone(&mut releaser, &held, then_sleep, false))
        };
        if let Failure::Cancel = failure {
            thread::sleep(Duration::from_millis(500));
            observer.query_one("SELECT pg_cancel_backend($1)", &[&pid]).unwrap();
        }
        let outcome = waiting.join().unwrap();
        release.join().unwrap();
        let expected: &[&str] = match failure {
            Failure::Cancel => &["57014"],
            Failure::WaitRunsOut => &["55P03"],
            Failure::StatementFails => &["22012"],
        };
        match &outcome {
            Err(code) => assert!(expected.contains(&code.as_str()), "{failure:?}: failed with {code}"),
            Ok(fence) => assert!(
                matches!(failure, Failure::WaitRunsOut) && fence.is_none(),
                "{failure:?}: the call returned {fence:?}"
            ),
        }
        if acquire(&mut observer, &key, "1 minute").is_none() {
            let holder = holder(&mut observer, &key);
            left_granted
                .push(format!("{failure:?}: held by {holder:?} after the call ended with {outcome:?}"));
        }
    }
    assert!(left_granted.is_empty(), "keys left granted by failed calls: {left_granted:#?}");
}

/// A release whose statement fails wakes nobody: the waiter keeps waiting, the holder keeps the key;
/// after the release that commits, the waiter has it.
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
    assert_eq!(release_alone(&mut holder_client, &held, 0.0, false), None, "granted in the release");
    let granted = waiting.join().unwrap().1.expect("not granted by the release that committed");
    assert!(granted.fence > held.fence);
}

/// Eight queued waiters, each releasing as soon as it is granted: each release wakes the next in
/// arrival order, and fences rise along the queue.
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
