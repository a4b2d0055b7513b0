//! Leader election with session-bound leases: three candidates wait for "leader"; the leader does
//! its work (a fenced counter) while it holds the lease. Every 3 s the leader's session is
//! terminated, which ends a session-bound lease at once: another candidate takes over, and the old
//! leader is told at its next renewal.
//!
//!     cargo run --example leader_election -- "host=127.0.0.1 user=postgres dbname=postgres" --seconds 10
mod common;
use common::{next_lease, plain, run_example, Chaos, Stats};
use pg_fence_client::{lease, AcquireOptions};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_postgres::Config;

const KEY: &str = "leader";
const TERMINATE: &str = "SELECT pg_terminate_backend(session_pid) FROM fence.leases WHERE key = $1 AND live";

#[tokio::main]
async fn main() {
    let setup = "CREATE TABLE IF NOT EXISTS leader_work (id int PRIMARY KEY, ticks bigint, leader text);
             INSERT INTO leader_work VALUES (1, 0, NULL) ON CONFLICT DO NOTHING";
    run_example(
        "leader_election",
        setup,
        3,
        Chaos { sql: TERMINATE, key: KEY, every: Duration::from_secs(3) },
        candidate,
    )
    .await;
}

async fn candidate(config: Config, n: usize, until: Instant, stats: Arc<Stats>) {
    let mut writer = plain(&config).await;
    let name = format!("candidate-{n}");
    let opts = AcquireOptions::new(Duration::from_secs(1))
        .owner(name.clone())
        .session_bound(true)
        .wait(Duration::from_secs(1));
    let mut terms = 0;
    while Instant::now() < until {
        let Some(held) = next_lease(&config, KEY, &opts).await else {
            continue;
        };
        terms += 1;
        while Instant::now() < until {
            tokio::select! {
                _ = held.lost() => { stats.told(); break; }
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
            let tx = writer.transaction().await.unwrap();
            let guarded = lease::fence_guard(&tx, KEY, held.fence()).await.map(|()| 1);
            if stats.refused(guarded).is_err() {
                stats.told();
                break;
            }
            tx.execute("UPDATE leader_work SET ticks = ticks + 1, leader = $1 WHERE id = 1", &[&name])
                .await
                .unwrap();
            tx.commit().await.unwrap();
        }
        let _ = held.release().await;
    }
    println!("{name}: led {terms} terms");
}
