//! What leader election needs beyond a lease, from real clients: why a lease ended
//! (fence.lease_status, and PF001's DETAIL), each reason produced for real and kept across a restart
//! where it survives one; lock-delay after an end that is not a release; and hand-off to a named
//! waiter, ahead of the queue.
use pg_fence_integration::{
    backend_pid, comes_to_wait_on, eventually, skipped_on_the_sql_edition, sqlstate, wait_until_past,
    Acquire, Cluster, Lease,
};
use postgres::Client;
use std::thread;
use std::time::Duration;
use uuid::Uuid;

/// (state, reason, fence, current_fence) of `token`'s lease on `key`.
type Status = (String, Option<String>, Option<i64>, Option<i64>);

fn status(client: &mut Client, key: &str, token: Uuid) -> Status {
    let row = client
        .query_one(
            "SELECT state, reason, fence, current_fence FROM fence.lease_status($1, $2)",
            &[&key, &token],
        )
        .unwrap();
    (row.get(0), row.get(1), row.get(2), row.get(3))
}

fn reason(client: &mut Client, lease: &Lease) -> String {
    let (state, reason, _, _) = status(client, &lease.key, lease.token);
    format!("{state}/{}", reason.unwrap_or_default())
}

/// The server's clock, seconds since 1970.
fn server_now(client: &mut Client) -> f64 {
    client.query_one("SELECT extract(epoch FROM clock_timestamp())::float8", &[]).unwrap().get(0)
}

/// When lease_status says `lease` ended, seconds since 1970.
fn ended_at(client: &mut Client, lease: &Lease) -> f64 {
    let sql = "SELECT extract(epoch FROM expires_at)::float8 FROM fence.lease_status($1, $2)";
    client.query_one(sql, &[&lease.key, &lease.token]).unwrap().get(0)
}

#[test]
fn status_tells_each_reason_and_the_durable_ones_survive_a_restart() {
    let cluster = Cluster::start("election_status", 27610, &[]);
    let mut client = cluster.connect();
    let acquire = |client: &mut Client, key: &str, ttl: &str| Acquire::new(key, ttl).run(client).unwrap();

    let live = acquire(&mut client, "live", "1 hour");
    let released = acquire(&mut client, "released", "1 hour");
    assert!(released.release(&mut client));
    let revoked = acquire(&mut client, "revoked", "1 hour");
    client.execute("SELECT fence.lease_revoke('revoked')", &[]).unwrap();
    let expired = acquire(&mut client, "expired", "1 second");
    let taken_over = acquire(&mut client, "taken_over", "1 second");
    let mut holder = cluster.connect();
    let session_ended = Acquire::new("session_ended", "1 hour").session_bound(true).run(&mut holder).unwrap();
    drop(holder);
    wait_until_past(&mut client, taken_over.expires_at.max(expired.expires_at));
    let successor = acquire(&mut client, "taken_over", "1 hour");
    assert!(successor.fence > taken_over.fence);

    let expected = [
        (&live, "live/"),
        (&released, "ended/released"),
        (&revoked, "ended/revoked"),
        (&expired, "ended/expired"),
        (&taken_over, "ended/taken_over"),
        (&session_ended, "ended/session_ended"),
    ];
    let check = |client: &mut Client, when: &str| {
        for (lease, want) in expected {
            assert!(
                eventually(Duration::from_secs(10), || reason(client, lease) == want),
                "{when}: {}: {} instead of {want}",
                lease.key,
                reason(client, lease)
            );
        }
    };
    check(&mut client, "as they ended");
    let (_, _, fence, current) = status(&mut client, "taken_over", taken_over.token);
    assert_eq!((fence, current), (Some(taken_over.fence), Some(successor.fence)));
    let (state, reason_of_stranger, fence, current) =
        status(&mut client, "live", Uuid::from_u128(0x005e_ed0f_a57a_49e4));
    assert_eq!((state.as_str(), reason_of_stranger.as_deref(), fence), ("ended", Some("unknown"), None));
    assert_eq!(current, Some(live.fence));

    // The sweep records the ends nobody called for, and a grant over them keeps their reasons.
    client.execute("SELECT fence.sweep()", &[]).unwrap();
    check(&mut client, "after a sweep");
    let err = revoked.renew(&mut client, "1 minute").unwrap_err();
    assert_eq!(sqlstate(&err), "PF001");
    let detail = err.as_db_error().and_then(|e| e.detail()).unwrap_or_default().to_string();
    assert!(detail.contains("revoked"), "PF001's DETAIL does not name the reason: {detail}");

    // Durable leases' reasons survive a restart and a crash; a fast lease is gone with its table.
    let fast = Acquire::new("fast", "1 hour").durable(false).run(&mut client).unwrap();
    assert_eq!(reason(&mut client, &fast), "live/");
    drop(client);
    cluster.stop_and_start();
    let mut client = cluster.connect();
    check(&mut client, "after a restart");
    drop(client);
    cluster.crash();
    cluster.restart();
    let mut client = cluster.connect();
    check(&mut client, "after a crash");
    assert_eq!(reason(&mut client, &fast), "ended/unknown", "a fast lease outlived a crash");
}

/// A fence_user can keep any free key from everyone for up to an hour with a lock-delay (take it
/// with a short TTL, let it expire): fence_admin lifts it with lease_revoke, durable and fast, and
/// a waiter is granted at once. (lease_revoke used to return false there, leaving the delay.)
#[test]
fn an_admin_lifts_a_lock_delay_with_lease_revoke() {
    let cluster = Cluster::start("election_lift", 27614, &[]);
    let mut admin = cluster.connect();
    admin.batch_execute("CREATE ROLE squatter LOGIN; GRANT fence_user TO squatter").unwrap();
    let mut squatter = cluster.connect_as("squatter");
    for durable in [true, false] {
        let key = if durable { "squatted" } else { "squatted-fast" };
        let lease =
            Acquire::new(key, "1 second").lock_delay("1 hour").durable(durable).run(&mut squatter).unwrap();
        wait_until_past(&mut admin, lease.expires_at);
        assert!(Acquire::new(key, "1 minute").run(&mut admin).is_none(), "{key}: no lock-delay to lift");
        let lifted: bool = admin.query_one("SELECT fence.lease_revoke($1)", &[&key]).unwrap().get(0);
        assert!(lifted, "{key}: lease_revoke did not lift the lock-delay");
        let next = Acquire::new(key, "1 minute").run(&mut admin).expect("still held back after the lift");
        assert!(next.fence > lease.fence);
        let again: bool = admin.query_one("SELECT fence.lease_revoke($1)", &[&key]).unwrap().get(0);
        assert!(again, "{key}: the live lease was not revoked");
        let nothing: bool =
            admin.query_one("SELECT fence.lease_revoke($1)", &[&"never-held"]).unwrap().get(0);
        assert!(!nothing, "a key with nothing to revoke or lift");
    }
}

#[test]
fn lock_delay_holds_grants_back_after_an_end_that_is_not_a_release() {
    let cluster = Cluster::start("election_delay", 27611, &[]);
    let mut client = cluster.connect();
    let delayed = |key: &'static str, ttl: &'static str| Acquire::new(key, ttl).lock_delay("2 seconds");

    // Expiry: nobody gets the key until 2 s after it, a waiter included.
    let first = delayed("expiry", "1 second").run(&mut client).unwrap();
    wait_until_past(&mut client, first.expires_at);
    assert!(Acquire::new("expiry", "1 minute").run(&mut client).is_none(), "granted within the lock-delay");
    let next = Acquire::new("expiry", "1 minute").wait("10 seconds").run(&mut client).unwrap();
    assert!(
        next.acquired_at >= first.expires_at + 2.0,
        "granted {:.3} s after the expiry",
        next.acquired_at - first.expires_at
    );
    assert!(next.fence > first.fence);

    // A release ends it at once.
    let released = delayed("release", "1 minute").run(&mut client).unwrap();
    assert!(released.release(&mut client));
    assert!(
        Acquire::new("release", "1 minute").run(&mut client).is_some(),
        "a release set off the lock-delay"
    );

    // A revocation.
    let revoked = delayed("revoke", "1 minute").run(&mut client).unwrap();
    client.execute("SELECT fence.lease_revoke('revoke')", &[]).unwrap();
    let end = ended_at(&mut client, &revoked);
    assert!(Acquire::new("revoke", "1 minute").run(&mut client).is_none(), "granted within the lock-delay");
    let next = Acquire::new("revoke", "1 minute").wait("10 seconds").run(&mut client).unwrap();
    assert!(next.acquired_at >= end + 2.0, "granted {:.3} s after the revocation", next.acquired_at - end);

    // A session's end, known from when it is first seen: no grant until 2 s after that.
    let mut holder = cluster.connect();
    let pid = backend_pid(&mut holder);
    let bound = delayed("session", "1 hour").session_bound(true).run(&mut holder).unwrap();
    let before_end = server_now(&mut client);
    client.execute("SELECT pg_terminate_backend($1)", &[&pid]).unwrap();
    assert!(eventually(Duration::from_secs(10), || reason(&mut client, &bound) == "ended/session_ended"));
    let seen_ended = server_now(&mut client);
    assert!(Acquire::new("session", "1 minute").run(&mut client).is_none(), "granted within the lock-delay");
    let next = Acquire::new("session", "1 minute").wait("10 seconds").run(&mut client).unwrap();
    assert!(
        next.acquired_at >= seen_ended + 2.0,
        "granted {:.3} s after the session's end was seen (it ended {:.3} s before that at most)",
        next.acquired_at - seen_ended,
        seen_ended - before_end
    );
}

#[test]
fn handoff_grants_the_named_waiter_ahead_of_the_queue_with_a_higher_fence() {
    let cluster = Cluster::start("election_handoff", 27612, &[]);
    let (mut old, mut admin) = (cluster.connect(), cluster.connect());
    let leader = Acquire::new("leader", "1 hour").owner("v1").run(&mut old).unwrap();

    // Two waiters: "first" at the head of the queue, "v2" behind it.
    let waiter = |owner: &'static str| {
        let mut client = cluster.connect();
        let pid = backend_pid(&mut client);
        let handle = thread::spawn(move || {
            let lease = Acquire::new("leader", "1 hour").owner(owner).wait("30 seconds").run(&mut client);
            (lease, client)
        });
        (pid, handle)
    };
    let (first_pid, first) = waiter("first");
    assert!(comes_to_wait_on(&mut admin, first_pid, "Extension"), "the first waiter did not wait");
    let (second_pid, second) = waiter("v2");
    assert!(comes_to_wait_on(&mut admin, second_pid, "Lock"), "the second waiter did not queue");

    // Nobody waits by that name, or not for a lease of this mode: nothing changes.
    let mut reader = cluster.connect();
    let reader_pid = backend_pid(&mut reader);
    let shared = thread::spawn(move || {
        Acquire::new("leader", "1 hour").owner("reader").shared(true).wait("3 seconds").run(&mut reader)
    });
    assert!(comes_to_wait_on(&mut admin, reader_pid, "Lock"), "the shared waiter did not queue");
    let handoff = "SELECT owner, fence, token FROM fence.lease_handoff('leader', $1, $2)";
    for nobody in ["v3", "reader"] {
        let row = old.query_one(handoff, &[&leader.token, &nobody]).unwrap();
        assert_eq!(row.get::<_, Option<i64>>(1), None, "handed off to {nobody}");
    }
    assert_eq!(reason(&mut admin, &leader), "live/");
    assert_eq!(shared.join().unwrap(), None, "the shared waiter was granted beside the exclusive lease");

    let row = old.query_one(handoff, &[&leader.token, &"v2"]).unwrap();
    let (owner, fence, token): (String, i64, Option<Uuid>) = (row.get(0), row.get(1), row.get(2));
    assert_eq!((owner.as_str(), token), ("v2", None), "the hand-off told a token, or to another owner");
    assert!(fence > leader.fence);
    let (lease, mut v2) = second.join().unwrap();
    let lease = lease.expect("the named waiter was not granted the key");
    assert_eq!((lease.owner.as_str(), lease.fence), ("v2", fence));
    assert!(!first.is_finished(), "the waiter ahead was granted the key too");

    // The old holder's lease is over: its renewal, and its writes under the old fence, are refused.
    assert_eq!(reason(&mut admin, &leader), "ended/released");
    assert_eq!(sqlstate(&leader.renew(&mut old, "1 minute").unwrap_err()), "PF001");
    let err = old.query_one("SELECT fence.fence_guard('leader', $1)", &[&leader.fence]).unwrap_err();
    assert_eq!(sqlstate(&err), "PF002");
    lease.renew(&mut v2, "1 hour").unwrap();

    // The waiter ahead keeps its place: it is next.
    assert!(lease.release(&mut v2));
    let (next, _) = first.join().unwrap();
    let next = next.expect("the waiter ahead was not granted the key after the hand-off");
    assert!(next.fence > fence);
}

#[test]
fn the_leader_election_example_of_the_docs_runs_as_it_says() {
    let cluster = Cluster::start("election_example", 27613, &[]);
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/examples/leader_election.sh");
    let output = std::process::Command::new("bash")
        .arg(script)
        .envs([("PGHOST", "127.0.0.1"), ("PGPORT", &cluster.port().to_string()), ("PGUSER", "postgres")])
        .output()
        .expect("run docs/examples/leader_election.sh");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the example failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    for expected in [
        "observer: leader is v1 at 10.0.0.1",
        "v1: handed off to v2 with fence",
        "observer: leader is v2 (fence",
        "v1: my lease ended, released",
        "v1: renewal refused",
        "observer: leader is v3 (fence",
        "observer: leader is v4 (fence",
    ] {
        assert!(lines.iter().any(|line| line.starts_with(expected)), "no line {expected:?} in:\n{stdout}");
    }
    let vacancies = lines.iter().filter(|line| **line == "observer: leader is nobody (fence none)").count();
    assert_eq!(vacancies, 3, "the observer did not see each vacancy:\n{stdout}");
    let after: f64 = lines
        .iter()
        .find_map(|line| line.strip_prefix("v4: leading, ")?.strip_suffix(" s after v3's lease expired"))
        .and_then(|seconds| seconds.parse().ok())
        .unwrap_or_else(|| panic!("no lock-delay line in:\n{stdout}"));
    assert!(after >= 2.0, "v4 was granted {after} s after v3's lease expired, within its lock-delay");
}

/// A leader frozen inside a transaction that passed its guard holds failover back: its lease expires
/// at its TTL, but the next grant waits for the writes under the old fence, until that transaction
/// ends. With pg_fence.guard_timeout the sweeper worker ends it past the timeout, and a candidate
/// leads while the frozen leader's transaction would still be open. Prints the failover times that
/// docs/leader-election.md quotes (from the leader's last renewal to the candidate's grant).
#[test]
fn a_frozen_leader_holds_back_failover_until_guard_timeout_ends_its_transaction() {
    if skipped_on_the_sql_edition("pg_fence.guard_timeout is the background worker's (issue 43 gives it up)")
    {
        return;
    }
    let settings = ["shared_preload_libraries=pg_fence", "pg_fence.sweep_interval=100ms"];
    let cluster = Cluster::start("election_frozen", 27615, &settings);
    let mut admin = cluster.connect();
    admin
        .batch_execute("CREATE TABLE work (id int PRIMARY KEY, fence bigint); INSERT INTO work VALUES (1, 0)")
        .unwrap();
    let mut failover = |guard_timeout: &str, frozen_for: Duration| -> (Duration, Option<String>) {
        admin.batch_execute(&format!("ALTER SYSTEM SET pg_fence.guard_timeout = '{guard_timeout}'")).unwrap();
        admin.batch_execute("SELECT pg_reload_conf()").unwrap();
        let mut leader = cluster.connect();
        let lease = Acquire::new("leader", "3 seconds").owner("frozen").run(&mut leader).unwrap();
        let frozen_at = std::time::Instant::now();
        // The leader's last act: a guarded write left open, as a process stopped mid-transaction leaves it.
        leader.batch_execute("BEGIN").unwrap();
        leader.query_one("SELECT fence.fence_guard('leader', $1)", &[&lease.fence]).unwrap();
        leader.execute("UPDATE work SET fence = $1 WHERE id = 1", &[&lease.fence]).unwrap();
        let unfreeze = thread::spawn(move || {
            thread::sleep(frozen_for);
            leader
                .batch_execute("COMMIT")
                .err()
                .map(|err| err.code().map_or(String::new(), |code| code.code().to_string()))
        });
        let mut candidate = cluster.connect();
        let granted =
            Acquire::new("leader", "3 seconds").owner("candidate").wait("60 seconds").run(&mut candidate);
        let took = frozen_at.elapsed();
        let granted = granted.expect("the candidate was never granted");
        assert!(granted.fence > lease.fence);
        assert!(granted.release(&mut candidate));
        (took, unfreeze.join().unwrap())
    };
    // Off: the grant waits for the frozen transaction, which commits its write under the old fence.
    let (off, ended) = failover("0", Duration::from_secs(7));
    assert_eq!(ended, None, "the frozen transaction was ended with guard_timeout off");
    assert!(off >= Duration::from_secs(7), "granted after {off:?}, before the frozen transaction ended");
    // On: the worker terminates the frozen transaction's backend, and its write rolls back.
    let (on, ended) = failover("1s", Duration::from_secs(20));
    assert!(
        ended.as_deref().is_some_and(|code| code == "57P01" || code.is_empty()),
        "frozen session: {ended:?}"
    );
    println!("failover with a leader frozen in a guarded transaction (ttl 3 s): guard_timeout off {off:?} (frozen 7 s), 1 s {on:?}");
}
