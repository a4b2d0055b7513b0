//! Failover: clients grant, write and release against a primary with a streaming standby; the
//! standby stops receiving WAL for a moment (its walreceiver SIGSTOPped), the primary is killed
//! (kill -9), the walreceiver too (losing what it had received but not written), and the standby
//! is promoted.
//!
//! With a synchronous standby nothing a client saw acknowledged is lost: no acknowledged grant or
//! write is missing (the commits made while the standby was stopped never returned). With an
//! asynchronous standby the same fault loses acknowledged grants and writes: the promoted standby
//! is a history that forgot them. Their holders still hold those fences, so in both cases the
//! promoted standby must hand out none of them again: every key's next grant is above every fence a
//! client was given, and a guard under any of them is refused. (Writes lost with the WAL stay lost:
//! fencing cannot bring data back, only keep a forgotten holder from writing.)
use pg_fence_integration::{next_history, signal, Acquire, Cluster, NextHistory};
use postgres::{Client, NoTls};
use rand::Rng;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

const KEYS: usize = 4;
const CLIENTS: usize = 6;

/// What clients saw acknowledged (their COMMIT returned): grants and fenced writes.
#[derive(Default)]
struct Acked {
    grants: Vec<(String, i64)>,
    writes: Vec<i64>,
}

const SCHEMA: &str = "CREATE TABLE writes (id bigint PRIMARY KEY, key text NOT NULL, fence bigint NOT NULL)";

/// Clients that acquire a random key, write under its fence (fence_guard, then an INSERT, in one
/// transaction) and release, until `stop`; on any error they reconnect and go on. Only what
/// committed in their sight is recorded: an error leaves the outcome unknown.
fn clients(port: u16, stop: &Arc<AtomicBool>, acked: &Arc<Mutex<Acked>>) -> Vec<thread::JoinHandle<()>> {
    let ids = Arc::new(AtomicI64::new(1));
    (0..CLIENTS)
        .map(|_| {
            let (stop, acked, ids) = (stop.clone(), acked.clone(), ids.clone());
            thread::spawn(move || {
                let config =
                    format!("host=127.0.0.1 port={port} user=postgres dbname=postgres connect_timeout=2");
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut client) = Client::connect(&config, NoTls) else {
                        thread::sleep(Duration::from_millis(20));
                        continue;
                    };
                    while !stop.load(Ordering::Relaxed) && round(&mut client, &acked, &ids).is_ok() {}
                }
            })
        })
        .collect()
}

fn round(client: &mut Client, acked: &Mutex<Acked>, ids: &AtomicI64) -> Result<(), postgres::Error> {
    let key = format!("key-{}", rand::thread_rng().gen_range(0..KEYS));
    let Some(lease) = Acquire::new(&key, "300 milliseconds").try_run(client)? else {
        return Ok(());
    };
    let fence = lease.fence;
    acked.lock().unwrap().grants.push((key.clone(), fence));
    let id = ids.fetch_add(1, Ordering::Relaxed);
    let mut tx = client.transaction()?;
    tx.query_one("SELECT fence.fence_guard($1, $2)", &[&key, &fence])?;
    tx.execute("INSERT INTO writes VALUES ($1, $2, $3)", &[&id, &key, &fence])?;
    tx.commit()?;
    acked.lock().unwrap().writes.push(id);
    lease.try_release(client)?;
    Ok(())
}

/// What the promoted standby shows of the primary's acknowledged history.
#[derive(Debug)]
struct Outcome {
    acked_grants: usize,
    acked_writes: usize,
    missing_writes: usize,
    /// Of the acknowledged grants (`forgotten`: those the promoted standby does not know), which
    /// fences its next grants reissue and whose guards it accepts.
    grants: NextHistory,
}

/// A primary and a streaming standby (synchronous or not) with clients on the primary, then the
/// fault, the promotion, and a look at the promoted standby.
fn fail_over(name: &str, ports: (u16, u16), synchronous: bool) -> Outcome {
    let primary = Cluster::start(name, ports.0, &[]);
    primary.connect().batch_execute(SCHEMA).unwrap();
    let standby = Cluster::start_standby(&format!("{name}_standby"), &primary, ports.1, &[]);
    let walreceiver = standby.walreceiver_pid();
    if synchronous {
        // Only now that the standby streams: before, every commit would have waited for it.
        primary.make_synchronous(&standby);
    }

    let (stop, acked) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(Acked::default())));
    let workers = clients(primary.port(), &stop, &acked);
    thread::sleep(Duration::from_secs(2));
    signal(walreceiver, "-STOP");
    thread::sleep(Duration::from_secs(1));
    primary.crash();
    stop.store(true, Ordering::Relaxed);
    workers.into_iter().for_each(|worker| worker.join().unwrap());
    // What the stopped walreceiver had not yet written is lost with it, as when a standby's host
    // dies (otherwise WAL already in its socket buffer would still arrive).
    signal(walreceiver, "-KILL");
    standby.wait_until_ready();
    standby.promote();

    let acked = std::mem::take(&mut *acked.lock().unwrap());
    let mut promoted = standby.connect();
    let mut missing_writes = 0;
    for id in &acked.writes {
        let found = promoted.query_opt("SELECT 1 FROM writes WHERE id = $1", &[id]).unwrap();
        missing_writes += usize::from(found.is_none());
    }
    // The promoted standby goes on granting every key, and meets every holder the primary had.
    let grants = next_history(&mut promoted, &acked.grants);
    let outcome = Outcome {
        acked_grants: acked.grants.len(),
        acked_writes: acked.writes.len(),
        missing_writes,
        grants,
    };
    let kind = if synchronous { "synchronous" } else { "asynchronous" };
    println!(
        "failover ({kind} standby): {} acknowledged grants lost, {} acknowledged writes lost; {outcome:?}",
        outcome.grants.forgotten, outcome.missing_writes
    );
    outcome
}

#[test]
fn failover_to_a_synchronous_standby_loses_nothing_acknowledged() {
    let outcome = fail_over("failover_sync", (27321, 27322), true);
    assert!(
        outcome.acked_grants > 50 && outcome.acked_writes > 50,
        "the workload did too little: {outcome:?}"
    );
    assert_eq!(outcome.grants.forgotten, 0, "{outcome:?}");
    assert_eq!(outcome.missing_writes, 0, "{outcome:?}");
    assert_eq!(outcome.grants.reissued, 0, "{outcome:?}");
    assert_eq!(outcome.grants.stale_guards_accepted, 0, "{outcome:?}");
}

/// The same fault with an asynchronous standby loses acknowledged grants and writes; the fences of
/// the lost grants must still never be handed out again, nor their holders' writes pass.
#[test]
fn failover_to_an_asynchronous_standby_loses_grants_but_reissues_no_fence() {
    let outcome = fail_over("failover_async", (27323, 27324), false);
    assert!(
        outcome.grants.forgotten > 0,
        "the fault lost no acknowledged grant, proving nothing: {outcome:?}"
    );
    assert_eq!(
        (outcome.grants.reissued, outcome.grants.stale_guards_accepted),
        (0, 0),
        "keys whose next grant reissued a fence, and stale guards accepted: {outcome:?}"
    );
}

/// A standby refuses fence_guard as it refuses every other call (25006): it may not have replayed
/// the revocation or the grant that made a fence stale, and its lock holds back no grant made on
/// the primary.
#[test]
fn a_standby_refuses_the_guard() {
    let primary = Cluster::start("guard_primary", 27308, &[]);
    let standby = Cluster::start_standby("guard_standby", &primary, 27309, &[]);
    let mut client = primary.connect();
    let lease = Acquire::new("k", "1 hour").run(&mut client).expect("the key is free");
    let (mut on_standby, fence) = (standby.connect(), lease.fence);
    let replayed = pg_fence_integration::eventually(Duration::from_secs(20), || {
        let seen = "SELECT count(*) FROM fence.lease_state WHERE key = 'k'";
        on_standby.query_one(seen, &[]).unwrap().get::<_, i64>(0) == 1
    });
    assert!(replayed, "the standby never replayed the grant");
    for call in ["SELECT fence.fence_guard('k', $1)", "SELECT fence.fence_holds('k', $1)"] {
        let err = on_standby.query_one(call, &[&fence]).expect_err("a standby must refuse the guard");
        assert_eq!(pg_fence_integration::sqlstate(&err), "25006", "{call}: {err}");
    }
}
