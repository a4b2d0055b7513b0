//! Leader election with the elector: three candidates campaign for "leader" with their name as the
//! value; the leader does its work (a fenced counter) while it leads, and an observer counts every
//! change of leader it sees. The leases are session-bound, and every 3 s the leader's session is
//! terminated, which ends its lease at once: another candidate is elected, and the old leader is
//! told why (`on_stopped_leading`: session_ended) within milliseconds.
//!
//!     cargo run --example leader_election -- "host=127.0.0.1 user=postgres dbname=postgres" --seconds 10
mod common;
use common::{plain, run_example, Chaos, Stats};
use pg_fence_client::{lease, AcquireOptions, ElectOptions, Elector, Error, StopReason};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_postgres::Config;

const KEY: &str = "leader";
const TERMINATE: &str = "SELECT pg_terminate_backend(session_pid) FROM fence.leases WHERE key = $1 AND live";

static OBSERVED: AtomicU64 = AtomicU64::new(0);

#[tokio::main]
async fn main() {
    let setup = "CREATE TABLE IF NOT EXISTS leader_work (id int PRIMARY KEY, ticks bigint, leader text);
             INSERT INTO leader_work VALUES (1, 0, NULL) ON CONFLICT DO NOTHING";
    let config: Config = common::args().config;
    let observer = tokio::spawn(observe(config));
    run_example(
        "leader_election",
        setup,
        3,
        Chaos { sql: TERMINATE, key: KEY, every: Duration::from_secs(3) },
        candidate,
    )
    .await;
    observer.abort();
    println!("leader_election: leader changes observed {}", OBSERVED.load(Ordering::Relaxed));
}

/// Every change of leader as observers see it: a new leader (a higher fence), or None.
async fn observe(config: Config) {
    let elector = Elector::new(config, KEY, ElectOptions::new(AcquireOptions::new(Duration::from_secs(1))));
    let mut leaders = elector.observe();
    while let Some(Ok(leader)) = leaders.next().await {
        OBSERVED.fetch_add(1, Ordering::Relaxed);
        match leader {
            Some(leader) => println!("observer: {} leads, fence {}", leader.owner, leader.fence),
            None => println!("observer: nobody leads"),
        }
    }
}

async fn candidate(config: Config, n: usize, until: Instant, stats: Arc<Stats>) {
    let mut writer = plain(&config).await;
    let name = format!("candidate-{n}");
    let told = stats.clone();
    let opts = ElectOptions::new(AcquireOptions::new(Duration::from_secs(1)).session_bound(true))
        .on_stopped_leading(move |reason| {
            if matches!(reason, StopReason::Lost(_)) {
                told.told();
            }
        });
    let elector = Elector::new(config, KEY, opts);
    let mut terms = 0;
    while Instant::now() < until {
        let leadership = match elector.campaign_for(&name, Duration::from_secs(1)).await {
            Ok(leadership) => leadership,
            Err(Error::WaitTimedOut { .. } | Error::LeaseLost { .. }) => continue,
            Err(err) => panic!("{err}"),
        };
        terms += 1;
        while Instant::now() < until {
            tokio::select! {
                _ = leadership.lost() => break,
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
            let tx = writer.transaction().await.unwrap();
            let guarded = lease::fence_guard(&tx, KEY, leadership.fence()).await.map(|()| 1);
            if stats.refused(guarded).is_err() {
                break;
            }
            tx.execute("UPDATE leader_work SET ticks = ticks + 1, leader = $1 WHERE id = 1", &[&name])
                .await
                .unwrap();
            tx.commit().await.unwrap();
        }
        if let Some(reason) = leadership.stopped_reason() {
            println!("{name}: stopped leading ({reason})");
        }
        let _ = leadership.resign().await;
    }
    println!("{name}: led {terms} terms");
}
