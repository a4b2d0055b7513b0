//! Benchmark client (pg_test/run-bench, scenario observe): what observers cost the key they watch.
//!
//!   observed_pairs OBSERVERS SECONDS DURABLE PORT
//!
//! OBSERVERS connections, each in a thread of its own, loop on fence.await_change of one key (a new
//! one each run), passing the state they were told last; one more connection makes acquire+release
//! pairs of that key (each call its own transaction; durable leases when DURABLE is `true`, fast
//! ones otherwise) for SECONDS.
//!
//! Output, one line: "OBSERVERS DURABLE PAIRS_PER_SECOND P50_MS P99_MS NOTICES", NOTICES being how many
//! answers the observers had in all (each a look at the key that returned a change).
use pg_fence_integration::{bench, Acquire};
use postgres::Client;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn observe(
    mut client: Client,
    key: String,
    stop: Arc<AtomicBool>,
    notices: Arc<AtomicU64>,
    ready: Arc<Barrier>,
) {
    let (mut fence, mut owner): (Option<i64>, Option<String>) = (None, None);
    ready.wait();
    while !stop.load(Ordering::Relaxed) {
        let row = client
            .query_one(
                "SELECT fence, owner FROM fence.await_change($1, $2, $3, '1 second')",
                &[&key, &fence, &owner],
            )
            .unwrap();
        let seen: (Option<i64>, Option<String>) = (row.get(0), row.get(1));
        if seen != (fence, owner.clone()) {
            notices.fetch_add(1, Ordering::Relaxed);
        }
        (fence, owner) = seen;
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, observers, seconds, durable, port] = &args[..] else {
        panic!("usage: observed_pairs OBSERVERS SECONDS DURABLE PORT");
    };
    let observers: usize = observers.parse().unwrap();
    let duration = Duration::from_secs_f64(seconds.parse().unwrap());
    let durable: bool = durable.parse().unwrap();
    let port: u16 = port.parse().unwrap();
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    let key = format!("observed-{nanos}");
    let (stop, notices) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let ready = Arc::new(Barrier::new(observers + 1));
    let watchers: Vec<_> = (0..observers)
        .map(|_| {
            let client = bench::connect(port, "postgres");
            let (key, stop, notices, ready) = (key.clone(), stop.clone(), notices.clone(), ready.clone());
            thread::spawn(move || observe(client, key, stop, notices, ready))
        })
        .collect();
    let mut client = bench::connect(port, "postgres");
    ready.wait();
    thread::sleep(Duration::from_millis(200)); // every observer waiting
    let mut latencies_us = Vec::new();
    let end = Instant::now() + duration;
    while Instant::now() < end {
        let start = Instant::now();
        let lease =
            Acquire::new(&key, "1 minute").durable(durable).run(&mut client).expect("the key is free");
        assert!(lease.release(&mut client));
        latencies_us.push(start.elapsed().as_micros() as u64);
    }
    let elapsed = duration.as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for watcher in watchers {
        watcher.join().unwrap();
    }
    latencies_us.sort_unstable();
    let at = |q: f64| bench::percentile(&latencies_us, q) as f64 / 1000.0;
    println!(
        "{observers} {durable} {:.0} {:.3} {:.3} {}",
        latencies_us.len() as f64 / elapsed,
        at(0.5),
        at(0.99),
        notices.load(Ordering::Relaxed)
    );
}
