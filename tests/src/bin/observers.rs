//! Benchmark client (pg_test/run-bench, scenario observe): how promptly observers of one key are told
//! of its changes by fence.await_change, against PostgreSQL's own LISTEN/NOTIFY on the same machine.
//!
//!   observers SYSTEM OBSERVERS CHANGES PORT
//!
//! SYSTEM `fence`: OBSERVERS connections, each in a thread of its own, loop on fence.await_change of
//! one key (a new one each run), passing the state they were told last; one more connection makes
//! CHANGES changes of the key, in cycles of six: a grant (ttl 1 hour), two proclaims of a new owner,
//! a release (vacancy), a grant with a ttl of 250 ms, and its expiry, which no call makes.
//! SYSTEM `notify`, the baseline: OBSERVERS connections LISTEN on one channel, and one connection
//! sends CHANGES notifications (`SELECT pg_notify(..)`, each its own transaction).
//! After each change the changer waits until every observer was told of it (at most 2 s), then
//! 20-50 ms more, at random, so that every observer waits again before the next change.
//!
//! A notice's latency runs from the change's commit to the moment the observer's client thread has
//! the answer of its call (or the notification). The commit lies between the start of the change's
//! COMMIT and its return, so each latency is given twice: from the COMMIT's return (a lower bound;
//! it can be below 0, when an observer is answered before the changer) and from its start (an
//! upper bound). An expiry commits nothing: its instant is the lease's expires_at, by the server's
//! clock, placed on the client's by the quickest of five clock_timestamp() round trips made just
//! before; half that round trip bounds it either way.
//!
//! Output, a line per kind of change (grant, proclaim, release, expiry and all of them; notify):
//! "SYSTEM OBSERVERS KIND NOTICES MISSED p50 p99 max p50_upper p99_upper max_upper", the latencies in
//! ms, the first three from the COMMIT's return, the last three from its start. MISSED: the pairs
//! of an observer and a change it was never told of (it was told of a later state first).
use pg_fence_integration::{bench, Acquire, Lease};
use postgres::fallible_iterator::FallibleIterator;
use postgres::{Client, Transaction};
use rand::Rng;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const CHANNEL: &str = "observe_bench";
/// The owner (or payload) that tells the observers the run is over; no change of the run.
const STOP: &str = "stop";
/// The ttl of the leases left to expire.
const SHORT_TTL: &str = "250 milliseconds";

/// What an observer is told. fence: the key's (fence, owner), both None for vacancy; notify: the
/// notification's number.
type State = (Option<i64>, Option<String>);

/// A state an observer was told, and when its client thread had it.
type Notice = (State, Instant);

/// One change: its kind, the state it made, and the interval its commit lies in.
struct Change {
    kind: &'static str,
    state: State,
    from: Instant,
    to: Instant,
}

#[derive(Clone, Copy, PartialEq)]
enum System {
    Fence,
    Notify,
}

/// An observer: its own connection and thread. It waits at `ready` once it is connected, then
/// collects what it is told until STOP, counting each notice in `told`.
fn observer(
    system: System,
    port: u16,
    key: Arc<String>,
    ready: Arc<Barrier>,
    told: Arc<AtomicUsize>,
) -> thread::JoinHandle<Vec<Notice>> {
    thread::spawn(move || {
        let mut client = bench::connect(port, "postgres");
        let mut notices = Vec::new();
        let mut record = |state: State| {
            notices.push((state, Instant::now()));
            told.fetch_add(1, Ordering::Relaxed);
        };
        match system {
            System::Fence => {
                let call = client
                    .prepare("SELECT fence, owner FROM fence.await_change($1, $2, $3, '10 seconds')")
                    .unwrap();
                ready.wait();
                let mut seen: State = (None, None);
                loop {
                    let row = client.query_one(&call, &[&*key, &seen.0, &seen.1]).unwrap();
                    let state: State = (row.get(0), row.get(1));
                    if state.1.as_deref() == Some(STOP) {
                        break;
                    }
                    if state != seen {
                        seen = state.clone();
                        record(state);
                    }
                }
            }
            System::Notify => {
                client.batch_execute(&format!("LISTEN {CHANNEL}")).unwrap();
                ready.wait();
                let mut notifications = client.notifications();
                let mut received = notifications.blocking_iter();
                while let Some(notification) = received.next().unwrap() {
                    if notification.payload() == STOP {
                        break;
                    }
                    record((Some(notification.payload().parse().unwrap()), None));
                }
            }
        }
        notices
    })
}

/// Signed milliseconds from `since` to `at`.
fn ms(at: Instant, since: Instant) -> f64 {
    match at.checked_duration_since(since) {
        Some(after) => after.as_secs_f64() * 1e3,
        None => -(since - at).as_secs_f64() * 1e3,
    }
}

/// The instant on this client's clock at which the server's clock reads `epoch` (seconds since
/// 1970), and how far off it may be: half the quickest of five clock_timestamp() round trips.
fn server_instant(client: &mut Client, epoch: f64) -> (Instant, Duration) {
    let (round_trip, midway, server_now) = (0..5)
        .map(|_| {
            let before = Instant::now();
            let row = client.query_one("SELECT extract(epoch FROM clock_timestamp())::float8", &[]).unwrap();
            let round_trip = before.elapsed();
            (round_trip, before + round_trip / 2, row.get::<_, f64>(0))
        })
        .min_by_key(|sample| sample.0)
        .unwrap();
    let offset = epoch - server_now;
    let at = if offset >= 0.0 {
        midway + Duration::from_secs_f64(offset)
    } else {
        midway - Duration::from_secs_f64(-offset)
    };
    (at, round_trip / 2)
}

/// Commits the transaction that made a change: the change, its commit lying between the start of
/// the COMMIT and its return.
fn commit(tx: Transaction, kind: &'static str, state: State) -> Change {
    let from = Instant::now();
    tx.commit().unwrap();
    Change { kind, state, from, to: Instant::now() }
}

/// Makes `changes` changes of `key` (see the top of this file), each in a transaction of its own;
/// returns them.
fn change_key(client: &mut Client, key: &str, changes: usize, pace: &mut dyn FnMut(Instant)) -> Vec<Change> {
    let mut lease: Option<Lease> = None;
    let mut made = Vec::new();
    for n in 0..changes {
        let owner = format!("node-{n}");
        let change = if n % 6 == 5 {
            let (at, off_by) = server_instant(client, lease.take().unwrap().expires_at);
            thread::sleep(at.saturating_duration_since(Instant::now()));
            Change { kind: "expiry", state: (None, None), from: at - off_by, to: at + off_by }
        } else {
            let mut tx = client.transaction().unwrap();
            match n % 6 {
                0 | 4 => {
                    let ttl = if n % 6 == 0 { "1 hour" } else { SHORT_TTL };
                    let granted = Acquire::new(key, ttl).owner(&owner).run(&mut tx).expect("the key is free");
                    let fence = granted.fence;
                    lease = Some(granted);
                    commit(tx, "grant", (Some(fence), Some(owner)))
                }
                1 | 2 => {
                    let held = lease.as_ref().unwrap();
                    let proclaimed: bool = tx
                        .query_one("SELECT fence.lease_proclaim($1, $2, $3)", &[&key, &held.token, &owner])
                        .unwrap()
                        .get(0);
                    assert!(proclaimed, "the proclaim found no live lease");
                    commit(tx, "proclaim", (Some(held.fence), Some(owner)))
                }
                _ => {
                    assert!(lease.take().unwrap().release(&mut tx), "the release found no live lease");
                    commit(tx, "release", (None, None))
                }
            }
        };
        pace(change.to);
        made.push(change);
    }
    // The end: a state with owner STOP.
    match &lease {
        Some(held) => client.execute("SELECT fence.lease_proclaim($1, $2, $3)", &[&key, &held.token, &STOP]),
        None => client.execute("SELECT fence.lease_acquire($1, '1 minute', owner => $2)", &[&key, &STOP]),
    }
    .unwrap();
    made
}

/// Sends `changes` notifications, each in a transaction of its own; returns them.
fn notify(client: &mut Client, changes: usize, pace: &mut dyn FnMut(Instant)) -> Vec<Change> {
    let send = client.prepare(&format!("SELECT pg_notify('{CHANNEL}', $1)")).unwrap();
    let mut made = Vec::new();
    for n in 0..changes {
        let mut tx = client.transaction().unwrap();
        tx.execute(&send, &[&n.to_string()]).unwrap();
        let change = commit(tx, "notify", (Some(n as i64), None));
        pace(change.to);
        made.push(change);
    }
    client.execute(&send, &[&STOP]).unwrap();
    made
}

/// One observer's latencies: (kind, from the return, from the start) of each change it was told
/// of. Its notices are matched to the changes in order: each to the first change after the one
/// matched before that made its state (a vacancy follows every grant).
fn latencies<'a>(changes: &'a [Change], notices: &[Notice]) -> Vec<(&'a str, f64, f64)> {
    let (mut measured, mut next) = (Vec::new(), 0);
    for (state, at) in notices {
        let Some(found) = changes[next..].iter().position(|change| change.state == *state) else {
            continue;
        };
        let change = &changes[next + found];
        measured.push((change.kind, ms(*at, change.to), ms(*at, change.from)));
        next += found + 1;
    }
    measured
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, system_name, observers, changes, port] = &args[..] else {
        panic!("usage: observers SYSTEM OBSERVERS CHANGES PORT");
    };
    let system = match system_name.as_str() {
        "fence" => System::Fence,
        "notify" => System::Notify,
        other => panic!("unknown system {other}"),
    };
    let (observers, changes): (usize, usize) = (observers.parse().unwrap(), changes.parse().unwrap());
    let port: u16 = port.parse().unwrap();
    let run = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros();
    let key = Arc::new(format!("observe-{run}"));
    let ready = Arc::new(Barrier::new(observers + 1));
    let told = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> =
        (0..observers).map(|_| observer(system, port, key.clone(), ready.clone(), told.clone())).collect();
    let mut client = bench::connect(port, "postgres");
    ready.wait();
    thread::sleep(Duration::from_millis(300)); // each observer's first call reaches its wait

    // After a change made by `to`: until every observer was told of it (at most 2 s), then 20-50 ms.
    // `expected`: the notices told so far if none is missed (after a miss, those told by then).
    let mut rng = rand::thread_rng();
    let mut expected = 0;
    let mut pace = |to: Instant| {
        expected += observers;
        while told.load(Ordering::Relaxed) < expected && to.elapsed() < Duration::from_secs(2) {
            thread::sleep(Duration::from_micros(200));
        }
        expected = expected.min(told.load(Ordering::Relaxed));
        thread::sleep(Duration::from_millis(rng.gen_range(20..=50)));
    };
    let made = match system {
        System::Fence => change_key(&mut client, &key, changes, &mut pace),
        System::Notify => notify(&mut client, changes, &mut pace),
    };

    let measured: Vec<_> =
        threads.into_iter().flat_map(|thread| latencies(&made, &thread.join().unwrap())).collect();
    let mut kinds: Vec<&str> = made.iter().map(|change| change.kind).collect();
    kinds.sort_unstable();
    kinds.dedup();
    if kinds.len() > 1 {
        kinds.push("all");
    }
    for kind in kinds {
        let of_kind = |change_kind: &str| kind == "all" || change_kind == kind;
        let (mut lower, mut upper): (Vec<f64>, Vec<f64>) = measured
            .iter()
            .filter(|(change_kind, _, _)| of_kind(change_kind))
            .map(|&(_, from_return, from_start)| (from_return, from_start))
            .unzip();
        let missed = made.iter().filter(|change| of_kind(change.kind)).count() * observers - lower.len();
        lower.sort_by(f64::total_cmp);
        upper.sort_by(f64::total_cmp);
        let stats = |values: &[f64]| {
            format!(
                "{:.3} {:.3} {:.3}",
                bench::percentile(values, 0.5),
                bench::percentile(values, 0.99),
                values.last().unwrap()
            )
        };
        println!(
            "{system_name} {observers} {kind} {} {} {} {}",
            lower.len(),
            missed,
            stats(&lower),
            stats(&upper)
        );
    }
}
