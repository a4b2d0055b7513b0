//! Readers share a document, a writer changes it alone: three readers hold shared leases of
//! "document" (`AcquireOptions::shared`, any number at once) and read its title and its body in two
//! guarded transactions with work between; the writer holds an exclusive lease of the same key,
//! granted only once no reader holds one (readers who come while it waits queue behind it), and
//! writes both in one guarded transaction. A reader never sees a title and a body of two versions
//! ("torn reads" stays 0): no writer is granted while it reads, and once its lease is revoked (every
//! 2 s, behind the holders' backs) its guard refuses the read.
//!
//!     cargo run --example readers_writers -- "host=127.0.0.1 user=postgres dbname=postgres" --seconds 10
mod common;
use common::{guarded, next_lease, plain, run_example, work, Chaos, Stats};
use pg_fence_client::AcquireOptions;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_postgres::Config;

const KEY: &str = "document";
static READS: AtomicU64 = AtomicU64::new(0);
static TORN: AtomicU64 = AtomicU64::new(0);

#[tokio::main]
async fn main() {
    let setup = "CREATE TABLE IF NOT EXISTS document (id int PRIMARY KEY, title text, body text);
             INSERT INTO document VALUES (1, 'v0', 'v0') ON CONFLICT DO NOTHING";
    run_example(
        "readers_writers",
        setup,
        4,
        Chaos { sql: "SELECT fence.lease_revoke($1)", key: KEY, every: Duration::from_secs(2) },
        worker,
    )
    .await;
    println!("readers_writers: consistent reads {}", READS.load(Ordering::Relaxed));
    println!("readers_writers: torn reads {}", TORN.load(Ordering::Relaxed));
}

/// Worker 0 writes, the others read.
async fn worker(config: Config, n: usize, until: Instant, stats: Arc<Stats>) {
    let mut conn = plain(&config).await;
    let opts = AcquireOptions::new(Duration::from_secs(1)).wait(Duration::from_secs(1));
    let opts = if n == 0 { opts.owner("writer") } else { opts.owner(format!("reader-{n}")).shared(true) };
    let mut version = 0;
    while Instant::now() < until {
        let Some(held) = next_lease(&config, KEY, &opts).await else {
            continue;
        };
        let guard = [(KEY, held.fence())];
        for _ in 0..3 {
            if !work(&held.lost_token(), Duration::from_millis(30), &stats).await {
                break;
            }
            let tx = conn.transaction().await.unwrap();
            if !guarded(&tx, &guard, &stats).await {
                break;
            }
            if n == 0 {
                version += 1;
                let text = format!("v{version}");
                tx.execute("UPDATE document SET title = $1, body = $1 WHERE id = 1", &[&text]).await.unwrap();
                tx.commit().await.unwrap();
                stats.wrote();
                continue;
            }
            let title: String =
                tx.query_one("SELECT title FROM document WHERE id = 1", &[]).await.unwrap().get(0);
            tx.commit().await.unwrap();
            // The reader's work between its two reads: the document must not change meanwhile.
            if !work(&held.lost_token(), Duration::from_millis(20), &stats).await {
                break;
            }
            let tx = conn.transaction().await.unwrap();
            if !guarded(&tx, &guard, &stats).await {
                break;
            }
            let body: String =
                tx.query_one("SELECT body FROM document WHERE id = 1", &[]).await.unwrap().get(0);
            tx.commit().await.unwrap();
            let counter = if title == body { &READS } else { &TORN };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        let _ = held.release().await;
        if n == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await; // the readers' turn
        }
    }
}
