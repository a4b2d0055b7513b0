//! Transfers between accounts under lease sets: four workers each take the leases of two random
//! accounts together (`hold_all`, all or none, so two transfers over one account never interleave
//! and two in opposite directions never deadlock), read both balances, work, then write both in one
//! transaction guarded with each account's own fence. Every second one account's lease is revoked
//! behind its holder's back, which loses that holder's whole set: its guard refuses the write, so
//! no money is ever made or lost ("total balance" stays what it was).
//!
//!     cargo run --example transfers -- "host=127.0.0.1 user=postgres dbname=postgres" --seconds 10
mod common;
use common::{guarded, next_set, plain, run_example, work, Chaos, Stats};
use pg_fence_client::AcquireOptions;
use rand::seq::index::sample;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_postgres::Config;

const ACCOUNTS: usize = 5;
/// Each account's balance when the table is made (the setup's 100).
const OPENING: i64 = 100;
/// Revokes one account's live lease, whichever is held.
const REVOKE: &str = "SELECT fence.lease_revoke(key) FROM fence.leases WHERE live AND key LIKE $1 LIMIT 1";

#[tokio::main]
async fn main() {
    let setup = "CREATE TABLE IF NOT EXISTS accounts (id int PRIMARY KEY, balance bigint NOT NULL);
             INSERT INTO accounts SELECT g, 100 FROM generate_series(0, 4) g ON CONFLICT DO NOTHING";
    run_example(
        "transfers",
        setup,
        4,
        Chaos { sql: REVOKE, key: "account:%", every: Duration::from_secs(1) },
        worker,
    )
    .await;
    let client = plain(&common::args().config).await;
    let total: i64 = client.query_one("SELECT sum(balance)::bigint FROM accounts", &[]).await.unwrap().get(0);
    println!("transfers: total balance {total} (opening: {})", OPENING * ACCOUNTS as i64);
    assert_eq!(total, OPENING * ACCOUNTS as i64, "money was made or lost");
}

async fn worker(config: Config, n: usize, until: Instant, stats: Arc<Stats>) {
    let mut conn = plain(&config).await;
    let opts = AcquireOptions::new(Duration::from_secs(1))
        .owner(format!("teller-{n}"))
        .wait(Duration::from_millis(500));
    let mut transfers = 0;
    while Instant::now() < until {
        let pair = sample(&mut rand::thread_rng(), ACCOUNTS, 2);
        let (from, to) = (pair.index(0) as i32, pair.index(1) as i32);
        let keys = [format!("account:{from}"), format!("account:{to}")];
        let Some(held) = next_set(&config, &keys, &opts).await else {
            continue;
        };
        let read = "SELECT balance FROM accounts WHERE id = $1";
        let balance = conn.query_one(read, &[&from]).await.unwrap().get::<_, i64>(0);
        let other = conn.query_one(read, &[&to]).await.unwrap().get::<_, i64>(0);
        let amount = balance / 2;
        if work(&held.lost_token(), Duration::from_millis(50), &stats).await {
            let tx = conn.transaction().await.unwrap();
            let fences: Vec<(&str, i64)> =
                keys.iter().map(|k| (k.as_str(), held.fence(k).unwrap())).collect();
            if guarded(&tx, &fences, &stats).await {
                let write = "UPDATE accounts SET balance = $2 WHERE id = $1";
                tx.execute(write, &[&from, &(balance - amount)]).await.unwrap();
                tx.execute(write, &[&to, &(other + amount)]).await.unwrap();
                tx.commit().await.unwrap();
                stats.wrote();
                transfers += 1;
            }
        }
        let _ = held.release().await;
    }
    println!("teller-{n}: {transfers} transfers");
}
