//! kill -9 of the whole server in the middle of a stream of grants and releases. After crash
//! recovery, every fence handed out must be above every fence a client saw acknowledged (committed)
//! before the crash, even for sessions that set synchronous_commit = off.
use pg_fence_integration::{Acquire, Cluster};
use postgres::Client;
use rand::Rng;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

const KEYS: usize = 8;

/// Settings that widen the window in which a commit can be acknowledged but not yet on disk:
/// the WAL writer flushes rarely, so an asynchronous commit stays in shared memory for long.
const LAZY_WAL_WRITER: &[&str] = &["wal_writer_delay=10s", "wal_writer_flush_after=1GB"];

/// One way of granting a key: returns the new fence, or None when the key is held.
type Grant = fn(&mut Client, &str) -> Result<Option<i64>, postgres::Error>;

/// How long a lease granted before the crash may outlive it: after restart, the check waits this long.
const TTL_MS: u64 = 200;

/// A grant, then its release: the release commits without a flush (it is all its transaction
/// writes), so the crash also hits releases that were acknowledged but never flushed.
fn pg_fence_grant(client: &mut Client, key: &str) -> Result<Option<i64>, postgres::Error> {
    let ttl = format!("{TTL_MS} milliseconds");
    let mut tx = client.transaction()?;
    let lease = Acquire::new(key, &ttl).try_run(&mut tx)?;
    // Acknowledged only once COMMIT has returned: before that the grant may not exist.
    tx.commit()?;
    if let Some(lease) = &lease {
        lease.try_release(client)?;
    }
    Ok(lease.map(|lease| lease.fence))
}

/// The same stream of grants, at a given synchronous_commit, until the server is killed. Returns
/// the highest acknowledged fence per key.
fn grants_until_crash(
    cluster: &Cluster,
    sessions: usize,
    synchronous_commit: &str,
    grant: Grant,
) -> HashMap<String, i64> {
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..sessions)
        .map(|_| {
            let mut client = cluster.connect();
            client.batch_execute(&format!("SET synchronous_commit = {synchronous_commit}")).unwrap();
            let stop = stop.clone();
            thread::spawn(move || {
                let mut acked: HashMap<String, i64> = HashMap::new();
                let mut rng = rand::thread_rng();
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("key-{}", rng.gen_range(0..KEYS));
                    match grant(&mut client, &key) {
                        Ok(Some(fence)) => {
                            let top = acked.entry(key).or_insert(0);
                            *top = (*top).max(fence);
                        }
                        Ok(None) => {}
                        Err(_) => break, // the server is gone: this call's outcome is unknown
                    }
                }
                acked
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(1_500));
    cluster.crash();
    stop.store(true, Ordering::Relaxed);
    let mut acked: HashMap<String, i64> = HashMap::new();
    for worker in workers {
        for (key, fence) in worker.join().unwrap() {
            let top = acked.entry(key).or_insert(0);
            *top = (*top).max(fence);
        }
    }
    acked
}

/// After restart, grants every key once more and returns the keys whose new fence is not above
/// the highest acknowledged one.
fn reissued_keys(cluster: &Cluster, acked: &HashMap<String, i64>, grant: Grant) -> Vec<String> {
    cluster.restart();
    let mut client = cluster.connect();
    let mut reissued = Vec::new();
    // Leases from before the crash, and releases the crash lost, lapse within the TTL.
    thread::sleep(Duration::from_millis(TTL_MS + 50));
    for (key, top) in acked {
        let fence = grant(&mut client, key).unwrap().expect("every lease from before the crash has expired");
        if fence <= *top {
            reissued.push(format!("{key}: acknowledged {top}, granted {fence} after restart"));
        }
    }
    reissued
}

fn assert_no_fence_reissued_after_crash(name: &str, port: u16, synchronous_commit: &str) {
    let cluster = Cluster::start(name, port, LAZY_WAL_WRITER);
    for round in 0..3 {
        let acked = grants_until_crash(&cluster, 4, synchronous_commit, pg_fence_grant);
        assert!(acked.values().sum::<i64>() > 0, "round {round}: no grant was acknowledged");
        let reissued = reissued_keys(&cluster, &acked, pg_fence_grant);
        assert!(reissued.is_empty(), "round {round}: fences handed out twice: {reissued:?}");
    }
}

#[test]
fn no_acknowledged_fence_is_reissued_after_a_crash() {
    assert_no_fence_reissued_after_crash("crash_sync", 26201, "on");
}

#[test]
fn no_acknowledged_fence_is_reissued_after_a_crash_with_synchronous_commit_off() {
    assert_no_fence_reissued_after_crash("crash_async", 26202, "off");
}

/// The control that shows the two tests above can fail: a hand-written lease table, granted from
/// sessions with synchronous_commit = off, does hand out acknowledged fences again after a crash.
#[test]
fn control_a_plain_sql_lease_with_synchronous_commit_off_reissues_fences() {
    fn plain_grant(client: &mut Client, key: &str) -> Result<Option<i64>, postgres::Error> {
        let mut tx = client.transaction()?;
        let fence = tx
            .query_opt(
                "INSERT INTO plain_lease AS l VALUES ($1, 1, clock_timestamp() + interval '1 millisecond')
                 ON CONFLICT (key) DO UPDATE SET fence = l.fence + 1, expires_at = excluded.expires_at
                  WHERE l.expires_at <= clock_timestamp()
                 RETURNING fence",
                &[&key],
            )?
            .map(|row| row.get(0));
        tx.commit()?;
        Ok(fence)
    }
    let cluster = Cluster::start("crash_control", 26203, LAZY_WAL_WRITER);
    cluster
        .connect()
        .batch_execute(
            "CREATE TABLE plain_lease (key text PRIMARY KEY, fence bigint, expires_at timestamptz)",
        )
        .unwrap();
    let mut reissued = Vec::new();
    for _ in 0..3 {
        let acked = grants_until_crash(&cluster, 4, "off", plain_grant);
        reissued.extend(reissued_keys(&cluster, &acked, plain_grant));
        if !reissued.is_empty() {
            break;
        }
    }
    assert!(!reissued.is_empty(), "the crash harness did not detect a single lost grant");
}
