//! Session-bound leases, from real clients: the lease ends with the session that took it, however
//! that session ends, and the next acquirer takes over at once with a higher fence. Plain leases
//! outlive their sessions.
use pg_fence_integration::{
    acquire, backend_pid, comes_to_wait_on, edition, eventually, sqlstate, Acquire, Cluster, Edition,
};
use postgres::Client;
use std::thread;
use std::time::{Duration, Instant};

/// Bounds how long a broken test hangs; never a measure of speed.
const GENEROUS: Duration = Duration::from_secs(20);
/// The promise of session-bound leases: another client has the key within a second of the holder's session ending.
const TAKEOVER: f64 = 1.0;

fn now(client: &mut Client) -> f64 {
    client.query_one("SELECT extract(epoch FROM clock_timestamp())::float8", &[]).unwrap().get(0)
}

/// pg_terminate_backend of the holder: a client already waiting for the key gets it with a higher
/// fence within a second (server clock, terminate to grant).
#[test]
fn terminating_the_holder_hands_the_key_to_a_waiter_at_once() {
    let cluster = Cluster::start("session_terminate", 26801, &[]);
    let (mut holder, mut observer) = (cluster.connect(), cluster.connect());
    let holder_pid = backend_pid(&mut holder);
    let fence = Acquire::new("job", "1 hour").session_bound(true).run(&mut holder).unwrap().fence;
    let session_pid: Option<i32> =
        observer.query_one("SELECT session_pid FROM fence.leases WHERE key = 'job'", &[]).unwrap().get(0);
    assert_eq!(session_pid, Some(holder_pid));

    let mut waiter = cluster.connect();
    let waiter_pid = backend_pid(&mut waiter);
    let handle = thread::spawn(move || Acquire::new("job", "1 hour").wait("1 minute").run(&mut waiter));
    assert!(comes_to_wait_on(&mut observer, waiter_pid, "Extension"));
    let terminated_at = now(&mut observer);
    observer.query_one("SELECT pg_terminate_backend($1)", &[&holder_pid]).unwrap();
    let next = handle.join().unwrap().expect("the waiter was not granted the key");
    let (next_fence, acquired_at) = (next.fence, next.acquired_at);
    assert!(next_fence > fence, "fence {next_fence} granted after {fence}");
    let takeover = acquired_at - terminated_at;
    println!("session-bound takeover after pg_terminate_backend: {:.1} ms", takeover * 1000.0);
    assert!(takeover < TAKEOVER, "took {takeover:.3} s after the holder was terminated");
}

/// A clean disconnect of the holder: a client that merely retries without `wait` gets the key with a
/// higher fence within a second.
#[test]
fn a_disconnected_holder_s_key_is_free_at_once() {
    let cluster = Cluster::start("session_disconnect", 26802, &[]);
    let (mut holder, mut other) = (cluster.connect(), cluster.connect());
    let fence = Acquire::new("job", "1 hour").session_bound(true).run(&mut holder).unwrap().fence;
    assert!(acquire(&mut other, "job", "1 hour").is_none(), "taken while its session is connected");
    let started = Instant::now();
    drop(holder);
    let mut granted = None;
    assert!(eventually(GENEROUS, || {
        granted = acquire(&mut other, "job", "1 hour");
        granted.is_some()
    }));
    let waited = started.elapsed().as_secs_f64();
    let next_fence = granted.unwrap().fence;
    assert!(next_fence > fence, "fence {next_fence} granted after {fence}");
    assert!(waited < TAKEOVER, "took {waited:.3} s after the holder disconnected");
}

/// A plain lease outlives its session; a session-bound one stays with a session that is connected
/// (renewals work), ends when that session drops its advisory locks (and stays ended when the
/// session binds another lease), and then its holder's fence is stale and its token renews nothing.
#[test]
fn only_the_end_of_its_session_ends_a_session_bound_lease() {
    let cluster = Cluster::start("session_bound", 26803, &[]);
    let (mut holder, mut other) = (cluster.connect(), cluster.connect());
    acquire(&mut holder, "plain", "1 hour").unwrap();
    let pid = backend_pid(&mut holder);
    drop(holder);
    // Its backend gone, locks and all (a fixed 200 ms did not make sure of that on a busy machine).
    let gone = "SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)
                   AND NOT EXISTS (SELECT FROM pg_locks WHERE pid = $1)";
    assert!(
        eventually(GENEROUS, || other.query_one(gone, &[&pid]).unwrap().get(0)),
        "the session never ended"
    );
    assert!(acquire(&mut other, "plain", "1 hour").is_none(), "a plain lease ended with its session");

    let mut holder = cluster.connect();
    let bound = Acquire::new("bound", "1 hour").session_bound(true).run(&mut holder).unwrap();
    let fence = bound.fence;
    bound.renew(&mut holder, "1 hour").unwrap();
    assert!(acquire(&mut other, "bound", "1 hour").is_none());
    // The holder's own statements see the lease live.
    let live: bool =
        holder.query_one("SELECT live FROM fence.leases WHERE key = 'bound'", &[]).unwrap().get(0);
    assert!(live);

    holder.batch_execute("SELECT pg_advisory_unlock_all()").unwrap();
    // A later session-bound grant in the same session takes a new session lock: the ended lease
    // does not come back with it.
    Acquire::new("another", "1 hour").session_bound(true).run(&mut holder).unwrap();
    let live: bool =
        other.query_one("SELECT live FROM fence.leases WHERE key = 'bound'", &[]).unwrap().get(0);
    assert!(!live, "a session-bound lease came back after its session lock was dropped");
    let next_fence =
        acquire(&mut other, "bound", "1 hour").expect("the ended lease's key was not granted").fence;
    assert!(next_fence > fence, "fence {next_fence} granted after {fence}");
    let err = bound.renew(&mut holder, "1 hour").unwrap_err();
    assert_eq!(sqlstate(&err), "PF001");
    let err = holder.query_one("SELECT fence.fence_guard('bound', $1)", &[&fence]).unwrap_err();
    assert_eq!(sqlstate(&err), "PF002");
}

/// A session-bound lease whose session ended is not kept alive by another session that read the
/// holder's session lock from pg_locks and queued on it (taking it when the holder's session
/// ended): the key is free for the next acquirer. The extension's session lock is of a class
/// PostgreSQL's pg_advisory_* cannot reach, so only the SQL edition's can be queued on like that.
#[test]
fn a_session_that_queued_on_an_ended_holder_s_lock_does_not_keep_its_lease() {
    if edition() == Edition::Extension {
        println!("skipped on the extension: its session lock is not an advisory lock pg_advisory_lock can queue on");
        return;
    }
    let cluster = Cluster::start("session_lock_taken", 26804, &[]);
    let (mut holder, mut observer, mut thief) = (cluster.connect(), cluster.connect(), cluster.connect());
    let lease = Acquire::new("taken", "1 hour").session_bound(true).run(&mut holder).unwrap();
    let pid = backend_pid(&mut holder);
    let ids: Vec<i64> = observer
        .query(
            "SELECT (classid::bigint << 32) | objid::bigint FROM pg_locks
              WHERE locktype = 'advisory' AND objsubid = 1 AND granted AND pid = $1",
            &[&pid],
        )
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(ids.len(), 1, "the holder's session locks: {ids:?}");
    let thief_pid = backend_pid(&mut thief);
    let id = ids[0];
    let queued = thread::spawn(move || {
        thief.execute("SELECT pg_advisory_lock($1)", &[&id]).unwrap();
        thief
    });
    assert!(comes_to_wait_on(&mut observer, thief_pid, "Lock"));
    drop(holder);
    let _thief = queued.join().unwrap();
    let next = Acquire::new("taken", "1 hour").wait("5 seconds").run(&mut observer);
    let next = next.expect("a session that took the ended holder's lock kept its lease alive");
    assert!(next.fence > lease.fence, "fence {} granted after {}", next.fence, lease.fence);
}

/// Session-bound grants that roll back leave no more behind than one does: the session reuses
/// one session lock, however many of its transactions that took one roll back.
#[test]
fn rolled_back_session_bound_grants_leave_no_lock_each() {
    let cluster = Cluster::start("session_rollbacks", 26805, &[]);
    let (mut client, mut observer) = (cluster.connect(), cluster.connect());
    let pid = backend_pid(&mut client);
    let held = |observer: &mut Client| -> i64 {
        observer
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = $1",
                &[&pid],
            )
            .unwrap()
            .get(0)
    };
    let mut counts = Vec::new();
    for n in 0..5 {
        let mut tx = client.transaction().unwrap();
        Acquire::new(&format!("rolled-back:{n}"), "1 hour").session_bound(true).run(&mut tx).unwrap();
        tx.rollback().unwrap();
        counts.push(held(&mut observer));
    }
    assert!(
        counts.iter().all(|&n| n == counts[0]),
        "advisory locks held after each rolled-back grant: {counts:?}"
    );
    // The lock it keeps still binds the next grant, which ends with the session.
    let lease = Acquire::new("kept", "1 hour").session_bound(true).run(&mut client).unwrap();
    assert!(
        acquire(&mut observer, "kept", "1 hour").is_none(),
        "a live session-bound lease's key was granted"
    );
    drop(client);
    let next = Acquire::new("kept", "1 hour").wait("5 seconds").run(&mut observer);
    assert!(next.expect("not granted after the holder's session ended").fence > lease.fence);
}
