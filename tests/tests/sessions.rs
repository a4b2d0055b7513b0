//! Session-bound leases, from real clients: the lease ends with the session that took it, however
//! that session ends, and the next acquirer takes over at once with a higher fence. Plain leases
//! outlive their sessions.
use pg_fence_integration::{backend_pid, comes_to_wait_on, eventually, sqlstate, Cluster};
use postgres::Client;
use std::thread;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Bounds how long a broken test hangs; never a measure of speed.
const GENEROUS: Duration = Duration::from_secs(20);
/// The promise: another client has the key within a second of the holder's session ending.
const TAKEOVER: f64 = 1.0;

fn acquire(client: &mut Client, key: &str, session_bound: bool) -> Option<(i64, Uuid)> {
    let row = client
        .query_one(
            "SELECT fence, token FROM fence.lease_acquire($1, '1 hour', session_bound => $2)",
            &[&key, &session_bound],
        )
        .unwrap();
    row.get::<_, Option<i64>>(0).map(|fence| (fence, row.get(1)))
}

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
    let (fence, _) = acquire(&mut holder, "job", true).unwrap();
    let session_pid: Option<i32> =
        observer.query_one("SELECT session_pid FROM fence.leases WHERE key = 'job'", &[]).unwrap().get(0);
    assert_eq!(session_pid, Some(holder_pid));

    let mut waiter = cluster.connect();
    let waiter_pid = backend_pid(&mut waiter);
    let handle = thread::spawn(move || {
        waiter
            .query_one(
                "SELECT fence, extract(epoch FROM acquired_at)::float8 FROM fence.lease_acquire('job', '1 hour', wait => '1 minute')",
                &[],
            )
            .unwrap()
    });
    assert!(comes_to_wait_on(&mut observer, waiter_pid, "Extension"));
    let terminated_at = now(&mut observer);
    observer.query_one("SELECT pg_terminate_backend($1)", &[&holder_pid]).unwrap();
    let row = handle.join().unwrap();
    let (next_fence, acquired_at): (Option<i64>, f64) = (row.get(0), row.get(1));
    let next_fence = next_fence.expect("the waiter was not granted the key");
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
    let (fence, _) = acquire(&mut holder, "job", true).unwrap();
    assert!(acquire(&mut other, "job", false).is_none(), "taken while its session is connected");
    let started = Instant::now();
    drop(holder);
    let mut granted = None;
    assert!(eventually(GENEROUS, || {
        granted = acquire(&mut other, "job", false);
        granted.is_some()
    }));
    let waited = started.elapsed().as_secs_f64();
    let (next_fence, _) = granted.unwrap();
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
    acquire(&mut holder, "plain", false).unwrap();
    drop(holder);
    thread::sleep(Duration::from_millis(200));
    assert!(acquire(&mut other, "plain", false).is_none(), "a plain lease ended with its session");

    let mut holder = cluster.connect();
    let (fence, token) = acquire(&mut holder, "bound", true).unwrap();
    holder.query_one("SELECT fence.lease_renew('bound', $1, '1 hour')", &[&token]).unwrap();
    assert!(acquire(&mut other, "bound", false).is_none());
    // The holder's own statements see the lease live.
    let live: bool =
        holder.query_one("SELECT live FROM fence.leases WHERE key = 'bound'", &[]).unwrap().get(0);
    assert!(live);

    holder.batch_execute("SELECT pg_advisory_unlock_all()").unwrap();
    // A later session-bound grant in the same session takes a new session lock: the ended lease
    // does not come back with it.
    acquire(&mut holder, "another", true).unwrap();
    let live: bool =
        other.query_one("SELECT live FROM fence.leases WHERE key = 'bound'", &[]).unwrap().get(0);
    assert!(!live, "a session-bound lease came back after its session lock was dropped");
    let (next_fence, _) = acquire(&mut other, "bound", false).expect("the ended lease's key was not granted");
    assert!(next_fence > fence, "fence {next_fence} granted after {fence}");
    let err = holder.query_one("SELECT fence.lease_renew('bound', $1, '1 hour')", &[&token]).unwrap_err();
    assert_eq!(sqlstate(&err), "PF001");
    let err = holder.query_one("SELECT fence.fence_guard('bound', $1)", &[&fence]).unwrap_err();
    assert_eq!(sqlstate(&err), "PF002");
}
