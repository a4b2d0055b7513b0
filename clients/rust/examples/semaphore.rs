//! At most N at once on one resource: five workers share the two permits of "gpu-pool" (a counting
//! semaphore, `AcquireOptions::permits`), each waiting in line (up to 1 s) for a permit, then doing
//! five steps, each written under the guard of its permit's own fence. Every 2 s the key's permits
//! are revoked behind their holders' backs.
//!
//!     cargo run --example semaphore -- "host=127.0.0.1 user=postgres dbname=postgres" --seconds 10
mod common;
use common::{guarded, next_lease, plain, run_example, work, Chaos, Stats};
use pg_fence_client::AcquireOptions;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_postgres::Config;

const KEY: &str = "gpu-pool";
const PERMITS: u32 = 2;

#[tokio::main]
async fn main() {
    let setup =
        "CREATE TABLE IF NOT EXISTS gpu_jobs (id bigserial PRIMARY KEY, fence bigint, worker text, step int)";
    run_example(
        "semaphore",
        setup,
        5,
        Chaos { sql: "SELECT fence.lease_revoke($1)", key: KEY, every: Duration::from_secs(2) },
        worker,
    )
    .await;
}

async fn worker(config: Config, n: usize, until: Instant, stats: Arc<Stats>) {
    let mut writer = plain(&config).await;
    let name = format!("worker-{n}");
    let opts = AcquireOptions::new(Duration::from_secs(1))
        .permits(PERMITS)
        .owner(name.clone())
        .wait(Duration::from_secs(1));
    let mut permits_held = 0;
    while Instant::now() < until {
        let Some(held) = next_lease(&config, KEY, &opts).await else {
            continue;
        };
        permits_held += 1;
        for step in 0..5i32 {
            if !work(&held.lost_token(), Duration::from_millis(50), &stats).await {
                break;
            }
            let tx = writer.transaction().await.unwrap();
            if !guarded(&tx, &[(KEY, held.fence())], &stats).await {
                break;
            }
            let insert = "INSERT INTO gpu_jobs (fence, worker, step) VALUES ($1, $2, $3)";
            tx.execute(insert, &[&held.fence(), &name, &step]).await.unwrap();
            tx.commit().await.unwrap();
            stats.wrote();
        }
        let _ = held.release().await;
    }
    println!("{name}: held a permit {permits_held} times");
}
