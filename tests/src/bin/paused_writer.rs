//! Client A of Kleppmann's scenario, as a process of its own so the tests can SIGSTOP it: acquires
//! a key, prints its fence, waits a while, then writes row 1 of table `resource` under that fence
//! and prints what happened ("accepted", or the SQLSTATE of the refusal).
//!
//!   paused_writer PORT KEY TTL_MS DELAY_MS single|transaction
//!
//! `single` writes with one fenced_update call; `transaction` runs fence_guard, pauses 20 ms, then a
//! plain UPDATE, and commits, so a SIGSTOP can land while it holds the guard.
use postgres::{Client, NoTls};
use std::io::Write;
use std::time::Duration;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, port, key, ttl_ms, delay_ms, mode] = &args[..] else {
        panic!("usage: paused_writer PORT KEY TTL_MS DELAY_MS single|transaction");
    };
    let config = format!("host=127.0.0.1 port={port} user=postgres dbname=postgres application_name=A");
    let mut client = Client::connect(&config, NoTls).expect("connect");
    let ttl = format!("{ttl_ms} milliseconds");
    let fence: i64 = loop {
        let row = client
            .query_one("SELECT (fence.lease_acquire($1, $2::text::interval)).fence", &[key, &ttl])
            .expect("acquire");
        if let Some(fence) = row.get::<_, Option<i64>>(0) {
            break fence;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    println!("fence {fence}");
    std::io::stdout().flush().unwrap();

    std::thread::sleep(Duration::from_millis(delay_ms.parse().unwrap()));
    let value = format!("A-{fence}");
    let outcome = match mode.as_str() {
        "single" => client
            .query_one(
                "SELECT fence.fenced_update($1, $2, 'resource',
                        jsonb_build_object('value', $3::text, 'last_fence', $2::bigint), '{\"id\": 1}')",
                &[key, &fence, &value],
            )
            .map(|_| ()),
        _ => (|| {
            let mut tx = client.transaction()?;
            tx.query_one("SELECT fence.fence_guard($1, $2)", &[key, &fence])?;
            std::thread::sleep(Duration::from_millis(20));
            tx.execute("UPDATE resource SET value = $1, last_fence = $2 WHERE id = 1", &[&value, &fence])?;
            tx.commit()
        })(),
    };
    match outcome {
        Ok(()) => println!("accepted"),
        Err(err) => println!("{}", err.code().map(|c| c.code().to_string()).unwrap_or(err.to_string())),
    }
}
