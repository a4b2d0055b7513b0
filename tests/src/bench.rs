//! What the benchmark clients (tests/src/bin/pairs.rs, observers.rs) share: their connection to the
//! benchmark's server, and how they read a percentile.
use postgres::{Client, NoTls};

/// A connection to `database` of the server on loopback `port`, as user postgres.
pub fn connect(port: u16, database: &str) -> Client {
    let config = format!("host=127.0.0.1 port={port} user=postgres dbname={database}");
    Client::connect(&config, NoTls).expect("connect")
}

/// The `p`th quantile (0.5, 0.99) of sorted values, nearest rank below. Panics when there are none.
pub fn percentile<T: Copy>(sorted: &[T], p: f64) -> T {
    sorted[((sorted.len() - 1) as f64 * p) as usize]
}
