//! One instance of a job at a time: three instances compete for "nightly-report"; the one holding
//! it writes progress under its fence and stops when told the lease is lost. Every 3 s the lease is
//! revoked behind the holder's back, as an operator (or a holder that stalled past its TTL) would.
//!
//!     cargo run --example singleton_job -- "host=127.0.0.1 user=postgres dbname=postgres" --seconds 10
mod common;
use common::{next_lease, plain, run_example, Chaos, Stats};
use pg_fence_client::{lease, AcquireOptions};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_postgres::Config;

const KEY: &str = "nightly-report";

#[tokio::main]
async fn main() {
    let setup = "CREATE TABLE IF NOT EXISTS report_progress (job text PRIMARY KEY, step bigint, fence bigint);
             CREATE TABLE IF NOT EXISTS report_rows (job text, step bigint, fence bigint, at timestamptz DEFAULT now());
             INSERT INTO report_progress VALUES ('nightly-report', 0, 0) ON CONFLICT DO NOTHING";
    run_example(
        "singleton_job",
        setup,
        3,
        Chaos { sql: "SELECT fence.lease_revoke($1)", key: KEY, every: Duration::from_secs(3) },
        instance,
    )
    .await;
}

async fn instance(config: Config, n: usize, until: Instant, stats: Arc<Stats>) {
    let mut writer = plain(&config).await;
    let opts = AcquireOptions::new(Duration::from_secs(2))
        .owner(format!("instance-{n}"))
        .wait(Duration::from_secs(1));
    while Instant::now() < until {
        let Some(held) = next_lease(&config, KEY, &opts).await else {
            continue;
        };
        let fence = held.fence();
        for step in 1i64.. {
            if Instant::now() >= until {
                let _ = held.release().await;
                return;
            }
            tokio::select! {
                _ = held.lost() => { stats.told(); break; }
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
            // A row and the progress counter, in one transaction under the guard.
            let tx = writer.transaction().await.unwrap();
            let guarded = lease::fence_guard(&tx, KEY, fence).await.map(|()| 0);
            if stats.refused(guarded).is_err() {
                stats.told();
                break;
            }
            let insert = "INSERT INTO report_rows (job, step, fence) VALUES ($1, $2, $3)";
            tx.execute(insert, &[&KEY, &step, &fence]).await.unwrap();
            let (changes, filter) = (json!({"step": step, "fence": fence}), json!({"job": KEY}));
            let progress = lease::fenced_update(&tx, KEY, fence, "report_progress", &changes, &filter).await;
            if stats.refused(progress).is_err() {
                stats.told();
                break;
            }
            tx.commit().await.unwrap();
        }
    }
}
