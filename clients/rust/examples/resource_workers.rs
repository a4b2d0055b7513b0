//! Workers competing for per-resource leases: four workers each take a random invoice's lease
//! ("invoice:N", waiting up to 500 ms for it), process it in two fenced steps, and release it. Every
//! 2 s one invoice's lease is revoked behind its holder's back.
//!
//!     cargo run --example resource_workers -- "host=127.0.0.1 user=postgres dbname=postgres" --seconds 10
mod common;
use common::{next_lease, run_example, Chaos, Stats};
use pg_fence_client::{AcquireOptions, FenceClient};
use rand::Rng;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_postgres::Config;

const INVOICES: i32 = 6;
/// Revokes whichever invoice is held, preferring invoice:1.
const REVOKE: &str = "SELECT fence.lease_revoke(key) FROM fence.leases
                      WHERE live AND key LIKE $1 ORDER BY key = 'invoice:1' DESC LIMIT 1";

#[tokio::main]
async fn main() {
    let setup = "CREATE TABLE IF NOT EXISTS invoices (id int PRIMARY KEY, status text, processed_by text, times bigint);
             INSERT INTO invoices SELECT g, 'open', NULL, 0 FROM generate_series(1, 6) g ON CONFLICT DO NOTHING";
    run_example(
        "resource_workers",
        setup,
        4,
        Chaos { sql: REVOKE, key: "invoice:%", every: Duration::from_secs(2) },
        worker,
    )
    .await;
}

async fn worker(config: Config, n: usize, until: Instant, stats: Arc<Stats>) {
    let writer = FenceClient::new(config.clone());
    let name = format!("worker-{n}");
    let opts =
        AcquireOptions::new(Duration::from_secs(2)).owner(name.clone()).wait(Duration::from_millis(500));
    let mut waits_timed_out = 0;
    while Instant::now() < until {
        let id = rand::thread_rng().gen_range(1..=INVOICES);
        let key = format!("invoice:{id}");
        let Some(held) = next_lease(&config, &key, &opts).await else {
            waits_timed_out += 1;
            continue;
        };
        for status in ["processing", "paid"] {
            // The work between the steps, cut short when the lease is lost.
            tokio::select! {
                _ = held.lost() => { stats.told(); break; }
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
            let changes = json!({"status": status, "processed_by": name});
            let write =
                writer.fenced_update(&key, held.fence(), "invoices", &changes, &json!({"id": id})).await;
            if stats.refused(write).is_err() {
                stats.told();
                break;
            }
        }
        let _ = held.release().await;
    }
    println!("{name}: {waits_timed_out} waits timed out");
}
