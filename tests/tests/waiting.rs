//! lease_acquire with `wait`, from real clients: a waiter is granted promptly when the lease ends,
//! also when the release commits at the end of a longer transaction, waiters are granted in arrival
//! order, a wait ends with NULL at its deadline, and cancel or statement_timeout end a wait leaving
//! nothing behind.
use pg_fence_integration::{
    acquire, backend_pid, edition, eventually, pg_program, signal, skipped_on_the_sql_edition, sqlstate,
    wait_event, Acquire, Cluster, Edition, Lease, CLIENT_GONE,
};
use postgres::Client;
use std::process::{Child, Stdio};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// Bounds how long a broken test hangs; never a measure of speed.
const GENEROUS: Duration = Duration::from_secs(20);

/// Runs a minute's acquire with `wait` on its own connection, in a thread; returns the connection's
/// pid.
fn waiter(cluster: &Cluster, key: &str, wait: &str) -> (i32, JoinHandle<(Client, Option<Lease>)>) {
    let mut client = cluster.connect();
    let pid = backend_pid(&mut client);
    let (key, wait) = (key.to_string(), wait.to_string());
    (
        pid,
        thread::spawn(move || {
            let grant = Acquire::new(&key, "1 minute").wait(&wait).run(&mut client);
            (client, grant)
        }),
    )
}

/// First in line: asleep on its latch inside lease_acquire.
fn sleeping(observer: &mut Client, pid: i32) -> bool {
    wait_event(observer, pid).0.as_deref() == Some("Extension")
}

/// Behind the first: queued for the key's waiting-room lock.
fn queued(observer: &mut Client, pid: i32) -> bool {
    wait_event(observer, pid) == (Some("Lock".into()), Some("advisory".into()))
}

/// pg_fence's advisory locks (key, waiting room, session) held or awaited by `pid`.
/// (The SQL edition's are advisory locks on one bigint, objsubid 1: sql/edition/locks.sql.)
fn fence_locks(observer: &mut Client, pid: i32) -> i64 {
    let classes = if edition() == Edition::Sql { "objsubid = 1" } else { "objsubid BETWEEN 28774 AND 28776" };
    observer
        .query_one(
            &format!("SELECT count(*) FROM pg_locks WHERE pid = $1 AND locktype = 'advisory' AND {classes}"),
            &[&pid],
        )
        .unwrap()
        .get(0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Release-to-grant delay over 200 handoffs, by the server's clock: from the moment the holder's
/// release returns (before its commit) to the waiter's acquired_at.
#[test]
fn a_release_wakes_the_waiter_promptly() {
    let cluster = Cluster::start("wait_delay", 26701, &[]);
    let (mut holder, mut observer) = (cluster.connect(), cluster.connect());
    let mut delays_ms = Vec::new();
    let mut previous_fence = i64::MIN;
    for _ in 0..200 {
        let lease = acquire(&mut holder, "hot", "1 minute").expect("the key is free");
        let fence = lease.fence;
        assert!(fence > previous_fence, "fence {fence} granted after {previous_fence}");
        let (pid, handle) = waiter(&cluster, "hot", "30 seconds");
        assert!(eventually(GENEROUS, || sleeping(&mut observer, pid)), "the waiter never went to sleep");
        let released_at: f64 = holder
            .query_one(
                "SELECT extract(epoch FROM clock_timestamp())::float8 FROM fence.lease_release('hot', $1) AS released WHERE released",
                &[&lease.token],
            )
            .unwrap()
            .get(0);
        let (mut waiting_client, grant) = handle.join().unwrap();
        let granted = grant.expect("the waiter was not granted the key");
        let (waiter_fence, acquired_at) = (granted.fence, granted.acquired_at);
        assert!(waiter_fence > fence, "fence {waiter_fence} granted after {fence}");
        delays_ms.push((acquired_at - released_at) * 1000.0);
        assert!(granted.release(&mut waiting_client));
        previous_fence = waiter_fence;
    }
    delays_ms.sort_by(f64::total_cmp);
    let (p50, p90, p99, max) = (
        percentile(&delays_ms, 0.5),
        percentile(&delays_ms, 0.9),
        percentile(&delays_ms, 0.99),
        delays_ms[delays_ms.len() - 1],
    );
    println!("release-to-grant over 200 handoffs: p50 {p50:.2} ms, p90 {p90:.2} ms, p99 {p99:.2} ms, max {max:.2} ms");
    assert!(delays_ms[0] >= 0.0, "granted before the release: {delays_ms:?}");
    assert!(p99 < 1000.0, "release-to-grant p99 {p99:.1} ms: the waiter is not woken by the release");
}

/// A release inside a transaction wakes the waiter when that transaction commits (not at the
/// waiter's next look of its own, up to 1 s later); one that is rolled back leaves the lease held
/// and the waiter waiting.
#[test]
fn a_release_in_a_transaction_wakes_the_waiter_at_its_commit() {
    let cluster = Cluster::start("wait_txn", 26709, &[]);
    let (mut holder, mut observer) = (cluster.connect(), cluster.connect());
    let mut delays_ms = Vec::new();
    for _ in 0..10 {
        let lease = acquire(&mut holder, "t", "1 minute").expect("the key is free");
        let fence = lease.fence;
        let (pid, handle) = waiter(&cluster, "t", "30 seconds");
        assert!(eventually(GENEROUS, || sleeping(&mut observer, pid)), "the waiter never went to sleep");

        holder.batch_execute("BEGIN").unwrap();
        assert!(lease.release(&mut holder));
        holder.batch_execute("ROLLBACK").unwrap();
        assert!(eventually(GENEROUS, || sleeping(&mut observer, pid)), "the waiter left its sleep");
        assert!(!handle.is_finished(), "granted although the release was rolled back");

        holder.batch_execute("BEGIN").unwrap();
        assert!(lease.release(&mut holder));
        let committing_at: f64 =
            holder.query_one("SELECT extract(epoch FROM clock_timestamp())::float8", &[]).unwrap().get(0);
        holder.batch_execute("COMMIT").unwrap();
        let (mut waiting_client, grant) = handle.join().unwrap();
        let granted = grant.expect("the waiter was not granted the key");
        let (waiter_fence, acquired_at) = (granted.fence, granted.acquired_at);
        assert!(waiter_fence > fence, "fence {waiter_fence} granted after {fence}");
        delays_ms.push((acquired_at - committing_at) * 1000.0);
        assert!(granted.release(&mut waiting_client));
    }
    delays_ms.sort_by(f64::total_cmp);
    let median = percentile(&delays_ms, 0.5);
    println!("commit-to-grant over 10 handoffs: median {median:.2} ms, all {delays_ms:.2?}");
    assert!(median < 500.0, "commit-to-grant median {median:.1} ms: the commit did not wake the waiter");
}

/// Eight waiters queued one after another are granted in that order.
#[test]
fn waiters_are_granted_in_arrival_order() {
    let cluster = Cluster::start("wait_fifo", 26702, &[]);
    let (mut holder, mut observer) = (cluster.connect(), cluster.connect());
    let lease = acquire(&mut holder, "fifo", "1 minute").unwrap();
    let first_fence = lease.fence;
    let mut handles = Vec::new();
    for i in 0..8 {
        let mut client = cluster.connect();
        let pid = backend_pid(&mut client);
        handles.push(thread::spawn(move || {
            let lease = Acquire::new("fifo", "1 minute")
                .wait("1 minute")
                .run(&mut client)
                .expect("waiter not granted");
            assert!(lease.release(&mut client)); // hands the key on to the next in line
            lease.fence
        }));
        let in_line =
            |observer: &mut Client| if i == 0 { sleeping(observer, pid) } else { queued(observer, pid) };
        assert!(eventually(GENEROUS, || in_line(&mut observer)), "waiter {i} never got in line");
    }
    assert!(lease.release(&mut holder));
    // Fences strictly increase in grant order, so waiters granted in arrival order hold fences
    // that increase in arrival order.
    let fences: Vec<i64> = handles.into_iter().map(|handle| handle.join().unwrap()).collect();
    let in_grant_order = std::iter::once(&first_fence).chain(&fences).collect::<Vec<_>>();
    assert!(
        in_grant_order.windows(2).all(|pair| pair[0] < pair[1]),
        "waiters were not granted in arrival order: {first_fence}, then {fences:?}"
    );
}

/// A wait that runs out returns NULL no earlier than its deadline, for the first in line and for
/// one queued behind it; both leave no lock behind, and the key is granted normally afterwards.
#[test]
fn a_wait_that_runs_out_returns_null_and_leaves_nothing_behind() {
    let cluster = Cluster::start("wait_timeout", 26703, &[]);
    let (mut holder, mut observer) = (cluster.connect(), cluster.connect());
    let lease = acquire(&mut holder, "busy", "1 minute").unwrap();
    let fence = lease.fence;
    const TIMED: &str = "SELECT extract(epoch FROM clock_timestamp())::float8,
                                fence.lease_acquire('busy', '1 minute', wait => $1::text::interval) IS NULL,
                                extract(epoch FROM clock_timestamp())::float8";
    let timed = |mut client: Client, wait: &'static str| {
        thread::spawn(move || {
            let row = client.query_one(TIMED, &[&wait]).unwrap();
            let (before, timed_out, after): (f64, bool, f64) = (row.get(0), row.get(1), row.get(2));
            (client, timed_out, after - before)
        })
    };
    let (mut first, mut second) = (cluster.connect(), cluster.connect());
    let (first_pid, second_pid) = (backend_pid(&mut first), backend_pid(&mut second));
    let first = timed(first, "800 milliseconds");
    assert!(eventually(GENEROUS, || sleeping(&mut observer, first_pid)));
    let second = timed(second, "300 milliseconds");
    for (handle, wait, pid) in [(second, 0.3, second_pid), (first, 0.8, first_pid)] {
        let (_client, timed_out, waited) = handle.join().unwrap();
        assert!(timed_out, "granted a key that stayed held");
        assert!(waited >= wait, "gave up after {waited} s, before its wait of {wait} s");
        assert_eq!(fence_locks(&mut observer, pid), 0, "a timed-out wait left a lock behind");
    }
    assert!(lease.release(&mut holder));
    let next = acquire(&mut observer, "busy", "1 minute").expect("not granted after the release").fence;
    assert!(next > fence, "fence {next} granted after {fence}");
}

/// pg_cancel_backend of a waiter (first in line, or queued) and statement_timeout end the wait
/// with 57014, leave no lock behind, and the connections and the key stay usable.
#[test]
fn cancel_and_statement_timeout_end_a_wait_cleanly() {
    let cluster = Cluster::start("wait_cancel", 26704, &[]);
    let (mut holder, mut observer) = (cluster.connect(), cluster.connect());
    let lease = acquire(&mut holder, "c", "1 minute").unwrap();
    let fence = lease.fence;
    let cancellable = |cluster: &Cluster| {
        let mut client = cluster.connect();
        let pid = backend_pid(&mut client);
        (
            pid,
            thread::spawn(move || {
                let result = Acquire::new("c", "1 minute").wait("1 minute").try_run(&mut client);
                (client, result.map(|_| ()).map_err(|err| sqlstate(&err)))
            }),
        )
    };
    let (first_pid, first) = cancellable(&cluster);
    assert!(eventually(GENEROUS, || sleeping(&mut observer, first_pid)));
    let (second_pid, second) = cancellable(&cluster);
    assert!(eventually(GENEROUS, || queued(&mut observer, second_pid)));
    for (pid, handle) in [(second_pid, second), (first_pid, first)] {
        observer.query_one("SELECT pg_cancel_backend($1)", &[&pid]).unwrap();
        let (mut client, result) = handle.join().unwrap();
        assert_eq!(result, Err("57014".to_string()), "cancel did not end the wait");
        // The error reaches the client just before the backend's abort releases its locks.
        let released = eventually(GENEROUS, || fence_locks(&mut observer, pid) == 0);
        assert!(released, "a cancelled wait left a lock behind");
        client.batch_execute("SELECT 1").unwrap();
    }

    let mut timed = cluster.connect();
    timed.batch_execute("SET statement_timeout = '200ms'").unwrap();
    let err = Acquire::new("c", "1 minute").wait("1 minute").try_run(&mut timed).unwrap_err();
    assert_eq!(sqlstate(&err), "57014");
    let pid = backend_pid(&mut timed);
    let released = eventually(GENEROUS, || fence_locks(&mut observer, pid) == 0);
    assert!(released, "a timed-out statement left a lock behind");

    assert!(lease.release(&mut holder));
    let next = Acquire::new("c", "1 minute")
        .wait("1 second")
        .run(&mut timed)
        .expect("not granted after the release")
        .fence;
    assert!(next > fence, "fence {next} granted after {fence}");
}

/// Expiry and revocation end the lease too: the waiter is granted at once (expiry) or promptly
/// (revocation) with a higher fence.
#[test]
fn expiry_and_revocation_hand_the_key_to_the_waiter() {
    let cluster = Cluster::start("wait_ends", 26705, &[]);
    let (mut holder, mut observer) = (cluster.connect(), cluster.connect());
    let expiring = acquire(&mut holder, "e", "500 milliseconds").expect("the key is free");
    let (expired, expires_at) = (expiring.fence, expiring.expires_at);
    let (_, handle) = waiter(&cluster, "e", "30 seconds");
    let (_, grant) = handle.join().unwrap();
    let granted = grant.expect("not granted after the lease expired");
    let (fence, acquired_at) = (granted.fence, granted.acquired_at);
    assert!(fence > expired, "fence {fence} granted after {expired}");
    assert!(acquired_at >= expires_at, "granted at {acquired_at}, before the lease expired at {expires_at}");

    let (pid, handle) = waiter(&cluster, "e", "30 seconds");
    assert!(eventually(GENEROUS, || sleeping(&mut observer, pid)));
    observer.query_one("SELECT fence.lease_revoke('e')", &[]).unwrap();
    let (_, grant) = handle.join().unwrap();
    let next = grant.expect("not granted after the lease was revoked").fence;
    assert!(next > fence, "fence {next} granted after the revoked {fence}");
}

/// A renewal that shortens the lease: the waiter, asleep until the old expiry, is woken and gets the
/// key once the shortened lease has run out.
#[test]
fn a_renewal_that_shortens_the_lease_reaches_the_waiter() {
    let cluster = Cluster::start("wait_renew", 26707, &[]);
    let (mut holder, mut observer) = (cluster.connect(), cluster.connect());
    let lease = acquire(&mut holder, "r", "1 minute").unwrap();
    let fence = lease.fence;
    let (pid, handle) = waiter(&cluster, "r", "30 seconds");
    assert!(eventually(GENEROUS, || sleeping(&mut observer, pid)));
    let new_expiry = lease.renew(&mut holder, "200 milliseconds").unwrap();
    let (_, grant) = handle.join().unwrap();
    let granted = grant.expect("not granted after the shortened lease ran out");
    let (next_fence, acquired_at) = (granted.fence, granted.acquired_at);
    assert!(next_fence > fence, "fence {next_fence} granted after {fence}");
    assert!(
        acquired_at >= new_expiry,
        "granted at {acquired_at}, before the renewed lease ended at {new_expiry}"
    );
}

/// While a waiter is first in line, an acquire without `wait` is refused even when the key is free:
/// the waiter is stopped (SIGSTOP of its backend) after the release woke it, so the key stays free.
#[test]
fn an_acquire_without_wait_does_not_jump_the_queue() {
    let cluster = Cluster::start("wait_queue", 26706, &[]);
    let (mut holder, mut observer) = (cluster.connect(), cluster.connect());
    let lease = acquire(&mut holder, "q", "1 minute").unwrap();
    let fence = lease.fence;
    let (pid, handle) = waiter(&cluster, "q", "1 minute");
    assert!(eventually(GENEROUS, || sleeping(&mut observer, pid)));
    signal(pid as u32, "-STOP");
    assert!(lease.release(&mut holder));
    let live: bool = observer.query_one("SELECT live FROM fence.leases WHERE key = 'q'", &[]).unwrap().get(0);
    assert!(!live);
    let barged = acquire(&mut observer, "q", "1 minute");
    signal(pid as u32, "-CONT");
    assert!(barged.is_none(), "an acquire without wait took the key from the waiter");
    let (_, grant) = handle.join().unwrap();
    let next = grant.expect("the waiter was not granted the key").fence;
    assert!(next > fence, "fence {next} granted after {fence}");
}

/// A retried acquire that brings the token of an earlier try still queued on the server (its
/// client gave up on it): when that try is granted first, the retry's answer is its lease, not a
/// wait for it to end.
#[test]
fn a_waiting_retry_returns_the_lease_its_earlier_try_was_granted() {
    const KEY: &str = "retry";
    let cluster = Cluster::start("wait_retry", 26710, &[]);
    let (mut holder, mut observer) = (cluster.connect(), cluster.connect());
    let held = acquire(&mut holder, KEY, "1 hour").expect("the key is free");
    let token = uuid::Uuid::from_u128(rand::random());
    let queue = |wait: &'static str| {
        let mut client = cluster.connect();
        let pid = backend_pid(&mut client);
        let call =
            thread::spawn(move || Acquire::new(KEY, "1 minute").wait(wait).token(token).run(&mut client));
        (pid, call)
    };
    let (first_pid, first) = queue("1 minute");
    assert!(eventually(GENEROUS, || sleeping(&mut observer, first_pid)), "the first try never waited");
    let (retry_pid, retry) = queue("10 seconds");
    assert!(eventually(GENEROUS, || queued(&mut observer, retry_pid)), "the retry never queued");
    assert!(held.release(&mut holder));
    let granted = first.join().unwrap().expect("the first try is granted at the release");
    let answered = retry.join().unwrap().map(|lease| (lease.fence, lease.token));
    assert_eq!(answered, Some((granted.fence, token)), "the retry did not return its own lease");
}

/// Errors pg_fence passes on carry no Rust backtrace, even with RUST_BACKTRACE=1 in the server's
/// environment: a cancelled wait's error is PostgreSQL's own, passed through pg_fence's wait.
#[test]
fn a_cancelled_wait_carries_no_rust_backtrace() {
    let cluster = Cluster::start_with_env("wait_backtrace", 26711, &[], &[("RUST_BACKTRACE", "1")]);
    let (mut holder, mut observer) = (cluster.connect(), cluster.connect());
    acquire(&mut holder, "held", "1 hour").expect("the key is free");
    let mut client = cluster.connect();
    let pid = backend_pid(&mut client);
    let call = thread::spawn(move || Acquire::new("held", "1 minute").wait("1 minute").try_run(&mut client));
    assert!(eventually(GENEROUS, || sleeping(&mut observer, pid)), "the waiter never waited");
    observer.execute("SELECT pg_cancel_backend($1)", &[&pid]).unwrap();
    let err = call.join().unwrap().expect_err("the cancel ends the wait with an error");
    assert_eq!(sqlstate(&err), "57014");
    let db = err.as_db_error().expect("a server error");
    let said = format!("{:?} {:?} {:?}", db.message(), db.detail(), db.hint());
    assert!(!said.contains("backtrace") && !said.contains("::"), "the error carries Rust internals: {said}");
}

/// kill -9 of a waiting acquirer, the head of the line with another queued behind it: the crash
/// recovery that follows ends every session; then nothing was granted to either, no lock of
/// theirs is left, and the key's line works: the next waiter is granted at the holder's release.
#[test]
fn kill_9_of_a_waiting_acquirer_leaves_nothing_granted_and_no_stuck_line() {
    let cluster = Cluster::start("wait_kill_9", 26712, &[]);
    let (mut holder, mut observer) = (cluster.connect(), cluster.connect());
    let held = acquire(&mut holder, "k9", "1 hour").expect("the key is free");
    let (head_pid, head) = waiter(&cluster, "k9", "1 minute");
    assert!(eventually(GENEROUS, || sleeping(&mut observer, head_pid)), "the head never waited");
    let (behind_pid, behind) = waiter(&cluster, "k9", "1 minute");
    assert!(eventually(GENEROUS, || queued(&mut observer, behind_pid)), "the second never queued");
    signal(head_pid as u32, "-KILL");
    // Both waiters' connections end with the crash recovery (their threads panic on it).
    let (_, _) = (head.join(), behind.join());
    cluster.wait_until_ready();
    let mut client = cluster.connect();
    let leases: Vec<(i64, bool)> = client
        .query("SELECT fence, live FROM fence.leases WHERE key = 'k9'", &[])
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(leases, [(held.fence, true)], "the holder's lease only");
    let locks: i64 =
        client.query_one("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'", &[]).unwrap().get(0);
    assert_eq!(locks, 0, "a killed waiter's lock outlived it");
    let (next_pid, next) = waiter(&cluster, "k9", "1 minute");
    assert!(eventually(GENEROUS, || sleeping(&mut client, next_pid)), "the next waiter never waited");
    assert!(held.release(&mut client));
    let granted = next.join().unwrap().1.expect("the next waiter is granted at the release");
    assert!(granted.fence > held.fence);
}

/// psql waiting in lease_acquire of `key` (`application_name` `name`; shared or not), returned once
/// its backend is `in_line` (first in line, or queued behind another waiter).
fn psql_waiting(
    cluster: &Cluster,
    observer: &mut Client,
    (key, shared): (&str, bool),
    name: &str,
    in_line: fn(&mut Client, i32) -> bool,
) -> Child {
    let sql = format!(
        "SET application_name = '{name}'; \
         SELECT fence.lease_acquire('{key}', '1 hour', wait => '1 minute', shared => {shared})"
    );
    let psql = pg_program("psql")
        .args([
            "-X",
            "-h",
            "127.0.0.1",
            "-p",
            &cluster.port().to_string(),
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-c",
            &sql,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run psql");
    let pid = |observer: &mut Client| {
        observer
            .query_opt(
                "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND state = 'active'",
                &[&name],
            )
            .unwrap()
            .map(|row| row.get::<_, i32>(0))
    };
    assert!(
        eventually(GENEROUS, || pid(observer).is_some_and(|pid| in_line(observer, pid))),
        "{name}: psql's acquire never waited"
    );
    psql
}

/// The live leases of `key`, their owners and fences.
fn live_leases(observer: &mut Client, key: &str) -> Vec<String> {
    observer
        .query("SELECT owner || ' fence ' || fence FROM fence.leases WHERE key = $1 AND live", &[&key])
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// A waiter whose client has gone (psql killed with SIGKILL while its acquire waits: its
/// connection closes, its backend waits on) is granted nothing when the key frees: nobody could
/// use or release that lease. Its backend ends as PostgreSQL ends a query whose client is gone.
/// First in line (asleep on its latch), and queued behind another waiter (in a lock wait).
#[test]
fn a_waiter_whose_client_has_gone_is_granted_nothing() {
    if skipped_on_the_sql_edition(CLIENT_GONE) {
        return;
    }
    let cluster = Cluster::start("wait_client_gone", 26715, &[]);
    let (mut holder, mut observer) = (cluster.connect(), cluster.connect());

    let held = acquire(&mut holder, "first", "1 hour").expect("the key is free");
    let mut psql = psql_waiting(&cluster, &mut observer, ("first", false), "gone_first", sleeping);
    psql.kill().unwrap();
    psql.wait().unwrap();
    assert!(held.release(&mut holder));
    let mut next = cluster.connect();
    let granted = Acquire::new("first", "1 minute").wait("5 seconds").run(&mut next);
    let left = live_leases(&mut observer, "first");
    assert!(granted.is_some(), "the key went to the waiter whose client had gone: {left:?}");

    // Queued behind a shared waiter, a shared waiter finds room beside it at its first look.
    let held = acquire(&mut holder, "queued", "1 hour").expect("the key is free");
    let mut head_client = cluster.connect();
    let head_pid = backend_pid(&mut head_client);
    let head = thread::spawn(move || {
        let lease = Acquire::new("queued", "1 minute").shared(true).wait("1 minute").run(&mut head_client);
        (head_client, lease)
    });
    assert!(eventually(GENEROUS, || sleeping(&mut observer, head_pid)), "the head never waited");
    let mut psql = psql_waiting(&cluster, &mut observer, ("queued", true), "gone_queued", queued);
    psql.kill().unwrap();
    psql.wait().unwrap();
    assert!(held.release(&mut holder));
    let (mut head_client, head_lease) = head.join().unwrap();
    let head_lease = head_lease.expect("the head of the line is granted at the release");
    // The queued waiter's backend has had its look by the time the head's release commits, or
    // looks then: an exclusive acquire waits for it either way.
    assert!(head_lease.release(&mut head_client));
    let granted = Acquire::new("queued", "1 minute").wait("5 seconds").run(&mut next);
    let left = live_leases(&mut observer, "queued");
    assert!(granted.is_some(), "the key went to a queued waiter whose client had gone: {left:?}");
}

/// Inside a statement (its call of lease_acquire).
fn running(observer: &mut Client, pid: i32) -> bool {
    let state: Option<String> =
        observer.query_one("SELECT state FROM pg_stat_activity WHERE pid = $1", &[&pid]).unwrap().get(0);
    state.as_deref() == Some("active")
}

/// Whether the key, freed, is granted to the next acquirer within a few seconds: a waiter that
/// gave up but kept the key's waiting room would keep it from everyone.
fn free_for_the_next(cluster: &Cluster, key: &str) -> bool {
    let mut next = cluster.connect();
    Acquire::new(key, "1 minute").wait("5 seconds").run(&mut next).is_some()
}

/// How the second waiter gives up.
#[derive(Clone, Copy, Debug)]
enum GivesUp {
    /// lease_acquire's `wait` runs out: NULL.
    Wait,
    /// statement_timeout cancels its call: 57014.
    StatementTimeout,
}

/// Two waiters behind a holder: the first, in line first, gives up after 300 ms (its `wait` runs
/// out) and so lets the second, queued behind it, to the front; the second gives up 0 to 12 ms
/// after that (by 0.5 ms; PostgreSQL may grant it the key's waiting room as its wait ends). Then
/// the holder releases, and the next acquirer must get the key: a waiter that gave up but kept the
/// waiting room would keep the key from everyone as long as its session lives. Many trials.
fn given_up_as_the_queue_moves(name: &str, port: u16, how: GivesUp) {
    let cluster = Cluster::start(name, port, &[]);
    let (mut holder, mut observer) = (cluster.connect(), cluster.connect());
    let (mut first, mut second) = (cluster.connect(), cluster.connect());
    let (first_pid, second_pid) = (backend_pid(&mut first), backend_pid(&mut second));
    let mut clients = Some((first, second));
    let started = std::time::Instant::now();
    for trial in 0..100 {
        if started.elapsed() > Duration::from_secs(40) {
            break;
        }
        let key = format!("k{trial}");
        let lease = acquire(&mut holder, &key, "1 minute").unwrap();
        let (mut first, mut second) = clients.take().unwrap();
        let first_key = key.clone();
        let first = thread::spawn(move || {
            let grant = Acquire::new(&first_key, "1 minute").wait("300 milliseconds").try_run(&mut first);
            (first, grant.map(|g| g.is_some()).map_err(|err| sqlstate(&err)))
        });
        assert!(eventually(GENEROUS, || running(&mut observer, first_pid)));
        thread::sleep(Duration::from_millis(30));
        let gives_up = format!("{} microseconds", 270_000 + (trial % 25) * 500);
        let second_key = key.clone();
        let second = thread::spawn(move || {
            let grant = match how {
                GivesUp::Wait => Acquire::new(&second_key, "1 minute").wait(&gives_up).try_run(&mut second),
                GivesUp::StatementTimeout => {
                    let timeout = format!("{}us", 270_000 + (trial % 25) * 500);
                    second.execute("SELECT set_config('statement_timeout', $1, false)", &[&timeout]).unwrap();
                    let grant = Acquire::new(&second_key, "1 minute").wait("1 minute").try_run(&mut second);
                    second.batch_execute("RESET statement_timeout").unwrap();
                    grant
                }
            };
            (second, grant.map(|g| g.is_some()).map_err(|err| sqlstate(&err)))
        });
        let (first, first_result) = first.join().unwrap();
        let (second, second_result) = second.join().unwrap();
        assert_eq!(first_result, Ok(false), "trial {trial}: the first waiter");
        let expected = match how {
            GivesUp::Wait => Ok(false),
            GivesUp::StatementTimeout => Err("57014".to_string()),
        };
        assert_eq!(second_result, expected, "trial {trial}: the second waiter");
        assert!(lease.release(&mut holder));
        assert!(
            free_for_the_next(&cluster, &key),
            "trial {trial}: key {key} not granted after its waiters gave up ({how:?}; pids {first_pid}, {second_pid})"
        );
        clients = Some((first, second));
    }
}

#[test]
fn a_waiter_timing_out_as_the_queue_moves_leaves_the_key_free() {
    given_up_as_the_queue_moves("wait_timeout_race", 26714, GivesUp::Wait);
}

#[test]
fn a_waiter_cancelled_as_the_queue_moves_leaves_the_key_free() {
    given_up_as_the_queue_moves("wait_cancel_race", 26713, GivesUp::StatementTimeout);
}
