//! Histories a server can be rolled onto, made with real faults against real clusters: a
//! grant whose synchronous replication wait was cancelled or whose session was terminated, then a
//! failover that loses it; point-in-time recovery to before some grants; the extension dropped and
//! created again. (Failover to an asynchronous standby is in failover.rs, restored dumps in dump.rs.)
//!
//! Each time the new history forgets grants that somebody was told, or could see, were made. Their
//! holders still believe in those fences, so the new history must never hand them out again: every
//! next grant is above every fence issued before, and a forgotten holder's guard is refused. A
//! per-key counter (fence = previous + 1) fails exactly this, as the new history continues from the
//! fence it remembers; clock-floored fences pass because the clock has moved on meanwhile. Every
//! test also checks that grants really were forgotten, so that it cannot pass by losing nothing.
use pg_fence_integration::{
    acquire, backend_pid, eventually, next_history, signal, sqlstate, wait_event, Acquire, BaseBackup,
    Cluster, Lease, NextHistory, ScratchDir,
};
use postgres::{Client, NoTls};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// Grants `key` (it must be free) and records the fence in `issued`; returns the lease.
fn grant(client: &mut Client, key: &str, ttl: &str, issued: &mut Vec<(String, i64)>) -> Lease {
    let lease = acquire(client, key, ttl).unwrap_or_else(|| panic!("{key} is held"));
    issued.push((key.to_string(), lease.fence));
    lease
}

/// Grants and releases `key` `times` times, recording the fences.
fn grant_and_release(client: &mut Client, key: &str, times: usize, issued: &mut Vec<(String, i64)>) {
    for _ in 0..times {
        grant(client, key, "1 hour", issued).release(client);
    }
}

fn assert_no_fence_reissued(outcome: NextHistory, forgotten: usize) {
    assert_eq!(outcome.forgotten, forgotten, "the fault did not lose what it should have: {outcome:?}");
    assert_eq!(
        (outcome.reissued, outcome.stale_guards_accepted),
        (0, 0),
        "the new history handed out fences issued before, and accepts their old holders' writes: {outcome:?}"
    );
}

#[derive(Clone, Copy, Debug)]
enum Interrupt {
    /// pg_cancel_backend: the commit returns with a WARNING, and the client has its fence.
    Cancel,
    /// pg_terminate_backend: the client loses its connection and never learns the fence, but every
    /// other session sees the key held under it.
    Terminate,
}

/// A primary with a synchronous standby whose walreceiver is stopped, so a grant's commit waits for
/// it; the wait is interrupted, which leaves the grant committed on the primary alone; then the
/// primary is killed (kill -9), the walreceiver too (losing what it had not read), and the standby is
/// promoted. Returns what the promoted standby makes of the fences issued on the primary.
fn interrupted_synchronous_wait(name: &str, ports: (u16, u16), interrupt: Interrupt) -> NextHistory {
    let primary = Cluster::start(name, ports.0, &[]);
    let standby = Cluster::start_standby(&format!("{name}_standby"), &primary, ports.1, &[]);
    let walreceiver = standby.walreceiver_pid();
    primary.make_synchronous(&standby);
    let key = "leader";
    let mut issued = Vec::new();
    // A grant the standby has (its commit waited for it), so the counter has something to go on from.
    grant_and_release(&mut primary.connect(), key, 1, &mut issued);
    // A release commits without waiting for its flush, let alone for the standby: wait until the
    // standby has it, or the promoted standby would find the key still held until the TTL ends.
    let mut on_standby = standby.connect();
    let released = "SELECT 1 FROM fence.leases WHERE key = 'leader' AND NOT live";
    let replicated =
        eventually(Duration::from_secs(20), || on_standby.query_opt(released, &[]).unwrap().is_some());
    assert!(replicated, "the standby never saw the release");

    let notices = Arc::new(Mutex::new(Vec::new()));
    let mut config: postgres::Config =
        format!("host=127.0.0.1 port={} user=postgres dbname=postgres", primary.port()).parse().unwrap();
    let sink = notices.clone();
    config.notice_callback(move |notice| sink.lock().unwrap().push(notice.message().to_string()));
    let mut holder = config.connect(NoTls).unwrap();
    let holder_pid = backend_pid(&mut holder);
    signal(walreceiver, "-STOP");
    let acquire = thread::spawn(move || {
        Acquire::new("leader", "1 hour")
            .try_run(&mut holder)
            .map(|lease| lease.expect("leader is free").fence)
    });
    let mut observer = primary.connect();
    let waits_for_standby = eventually(Duration::from_secs(20), || {
        wait_event(&mut observer, holder_pid) == (Some("IPC".into()), Some("SyncRep".into()))
    });
    assert!(waits_for_standby, "the grant's commit never waited for the standby");

    let fence = match interrupt {
        Interrupt::Cancel => {
            observer.query_one("SELECT pg_cancel_backend($1)", &[&holder_pid]).unwrap();
            let told = acquire.join().unwrap().expect("a cancelled commit wait still returns the grant");
            let warned = notices.lock().unwrap().iter().any(|n| n.contains("canceling wait for synchronous"));
            assert!(warned, "no warning about the cancelled wait: {:?}", notices.lock().unwrap());
            told
        }
        Interrupt::Terminate => {
            observer.query_one("SELECT pg_terminate_backend($1)", &[&holder_pid]).unwrap();
            let err = acquire.join().unwrap().expect_err("a terminated session cannot return the grant");
            println!("the terminated holder saw: {err}");
            // Its commit became visible as its backend exited.
            let held = "SELECT fence FROM fence.leases WHERE key = 'leader' AND live";
            let mut seen = None;
            let visible = eventually(Duration::from_secs(20), || {
                seen = observer.query_opt(held, &[]).unwrap().map(|row| row.get::<_, i64>(0));
                seen.is_some()
            });
            assert!(visible, "the terminated session's grant never showed");
            seen.unwrap()
        }
    };
    assert!(fence > issued[0].1);
    issued.push((key.to_string(), fence));

    primary.crash();
    // Unread WAL in the stopped walreceiver's socket goes with it, as when the standby's host dies.
    signal(walreceiver, "-KILL");
    standby.wait_until_ready();
    standby.promote();
    let outcome = next_history(&mut standby.connect(), &issued);
    println!("{interrupt:?} during the synchronous wait, then failover: fences {issued:?}, {outcome:?}");
    outcome
}

#[test]
fn a_grant_whose_synchronous_wait_was_cancelled_is_not_reissued_after_failover() {
    let outcome = interrupted_synchronous_wait("history_cancel", (27301, 27302), Interrupt::Cancel);
    assert_no_fence_reissued(outcome, 1);
}

#[test]
fn a_grant_whose_session_was_terminated_in_its_synchronous_wait_is_not_reissued_after_failover() {
    let outcome = interrupted_synchronous_wait("history_terminate", (27303, 27304), Interrupt::Terminate);
    assert_no_fence_reissued(outcome, 1);
}

/// A base backup and a WAL archive; grants before and after a named restore point; a new cluster
/// recovered from the backup to that point. The grants after it are the history it forgets; one of
/// them is still held, on the original, by a holder that knows nothing of the recovery.
#[test]
fn point_in_time_recovery_reissues_no_fence() {
    let archive = ScratchDir::create("pitr_archive");
    let archive_command = format!("archive_command=cp %p {}/%f", archive.path().display());
    let original = Cluster::start("pitr", 27305, &["archive_mode=on", &archive_command]);
    let mut client = original.connect();
    let keys = ["a", "b", "c"];
    let mut issued = Vec::new();
    for key in keys {
        grant_and_release(&mut client, key, 2, &mut issued);
    }
    let backup = BaseBackup::take("pitr_base", &original);
    // Replayed from the archive: what recovery must bring back.
    for key in keys {
        grant_and_release(&mut client, key, 2, &mut issued);
    }
    client.query_one("SELECT pg_create_restore_point('before_the_lost_grants')", &[]).unwrap();
    let remembered = issued.len();
    for key in keys {
        grant_and_release(&mut client, key, 2, &mut issued);
    }
    grant_and_release(&mut client, "only_after", 1, &mut issued);
    grant(&mut client, "a", "1 hour", &mut issued);
    // Recovery needs the WAL up to the restore point in the archive: close the segment, wait for it.
    let segment: String = client.query_one("SELECT pg_walfile_name(pg_switch_wal())", &[]).unwrap().get(0);
    let archived = eventually(Duration::from_secs(30), || {
        let last: Option<String> =
            client.query_one("SELECT last_archived_wal FROM pg_stat_archiver", &[]).unwrap().get(0);
        last.is_some_and(|last| last >= segment)
    });
    assert!(archived, "{segment} never reached the archive");

    let restore_command = format!("restore_command=cp {}/%f %p", archive.path().display());
    let settings = [
        restore_command.as_str(),
        "recovery_target_name=before_the_lost_grants",
        "recovery_target_action=promote",
    ];
    let recovered = Cluster::recover("pitr_recovered", &backup, 27306, &settings);
    let outcome = next_history(&mut recovered.connect(), &issued);
    println!(
        "point-in-time recovery: {} grants, {} after the target, {outcome:?}",
        issued.len(),
        issued.len() - remembered
    );
    assert_no_fence_reissued(outcome, issued.len() - remembered);
}

/// DROP EXTENSION takes the lease table with it, and CREATE EXTENSION starts an empty one, while a
/// holder of the old one still holds its lease and a fenced table keeps the fences written under it.
#[test]
fn drop_and_create_extension_reissues_no_fence() {
    let cluster = Cluster::start("recreate", 27307, &[]);
    let mut client = cluster.connect();
    client.batch_execute("CREATE TABLE doc (id int PRIMARY KEY, body text, fence bigint)").unwrap();
    client.batch_execute("INSERT INTO doc VALUES (1, 'draft', NULL)").unwrap();
    let mut issued = Vec::new();
    for key in ["a", "b", "doc"] {
        grant_and_release(&mut client, key, 3, &mut issued);
    }
    grant(&mut client, "doc", "1 hour", &mut issued);
    let old_fence = issued.last().unwrap().1;
    let write =
        "SELECT fence.fenced_write('doc', 'fence', $1, '{\"body\": \"by the old holder\"}', '{\"id\": 1}')";
    client.query_one(write, &[&old_fence]).unwrap();
    drop(client);

    cluster.connect().batch_execute("DROP EXTENSION pg_fence; CREATE EXTENSION pg_fence").unwrap();
    let mut client = cluster.connect();
    let outcome = next_history(&mut client, &issued);
    println!("DROP and CREATE EXTENSION: fences {issued:?}, {outcome:?}");
    // The next holder of 'doc' (next_history took it) must be able to write the fenced table, whose
    // row still holds the old holder's fence: a fence below it is refused there, which locks out the
    // rightful holder of a restarted counter.
    let new_fence: i64 = client.query_one("SELECT fence.current_fence('doc')", &[]).unwrap().get(0);
    let written = client.query_one(write, &[&new_fence]).map(|row| row.get::<_, i64>(0));
    println!(
        "the next holder's fenced write under {new_fence}, over the old holder's {old_fence}: {written:?}"
    );
    assert_no_fence_reissued(outcome, issued.len());
    match written {
        Ok(rows) => assert_eq!(rows, 1),
        Err(err) => panic!("the new holder's fence {new_fence} was refused ({}): {err}", sqlstate(&err)),
    }
}

/// The fast reservation runs ahead of the clock (src/leases/state/fences.rs), and the grants after a crash
/// start above it. DROP and CREATE EXTENSION forgets the reservation with everything else: the next
/// grants must still be above those grants' fences, at once. (They are, because the first grant
/// after the crash waited for the clock to pass the reservation: no fence ran ahead of the clock.)
#[test]
fn drop_and_create_extension_right_after_grants_above_the_fast_reservation_reissues_no_fence() {
    let cluster = Cluster::start("recreate_ahead", 27308, &[]);
    let mut issued = Vec::new();
    let mut fast = cluster.connect();
    Acquire::new("fast", "1 hour").durable(false).run(&mut fast).expect("fast is free").release(&mut fast);
    let mut client = cluster.connect();
    grant_and_release(&mut client, "new-connection", 2, &mut issued);
    drop((fast, client));
    cluster.crash();
    cluster.restart();
    let mut client = cluster.connect();
    let reserved: i64 = client.query_one("SELECT max(fence) FROM fence.fast_reserve", &[]).unwrap().get(0);
    grant_and_release(&mut client, "after-crash", 2, &mut issued);
    let above_reservation = issued.iter().filter(|(key, _)| key == "after-crash").all(|(_, f)| *f > reserved);
    assert!(
        above_reservation,
        "a grant after the crash was not above the reservation {reserved}: {issued:?}"
    );
    let ahead: bool = client
        .query_one(
            "SELECT max(fence) > (extract(epoch FROM clock_timestamp()) * 1000000)::bigint FROM fence.lease_state",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(!ahead, "a fence ran ahead of the clock: {issued:?}");
    client.batch_execute("DROP EXTENSION pg_fence; CREATE EXTENSION pg_fence").unwrap();
    let mut client = cluster.connect();
    let outcome = next_history(&mut client, &issued);
    println!(
        "DROP and CREATE EXTENSION right after grants above the fast reservation: {issued:?}, {outcome:?}"
    );
    assert_no_fence_reissued(outcome, issued.len());
}
