//! Load generator for the benchmark (pg_test/run-bench): N clients each doing acquire+release pairs
//! on random keys, against one lock system, for a fixed time; prints throughput and the latency of
//! a pair (p50, p99). One client program for every system, so their numbers compare.
//!
//!   pairs SYSTEM CLIENTS SECONDS KEYS PORT
//!
//! SYSTEM: fence (pg_fence), sql_lease (the same fenced lease by hand in SQL), sql_lease_1flush
//! (the same, its release committed without waiting for a flush: one flush per pair, as pg_fence
//! spends, but none of pg_fence's code), advisory (pg_advisory_lock/unlock), redis (SET NX PX +
//! compare-and-delete script). PORT is PostgreSQL's,
//! or Redis's for redis; PAIRS_DATABASE names the database (default postgres). Keys are k1..kKEYS.
//! Output: "SYSTEM CLIENTS pairs/s p50_ms p99_ms refused".
use postgres::{Client, NoTls};
use rand::Rng;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};
use uuid::Uuid;

const SQL_ACQUIRE: &str = "
    WITH acq AS (
        INSERT INTO bench_lease AS l (key, fence, token, expires_at)
        VALUES ($1, 1, $2, clock_timestamp() + interval '30 seconds')
        ON CONFLICT (key) DO UPDATE
           SET fence = l.fence + 1, token = excluded.token, expires_at = excluded.expires_at
         WHERE l.expires_at <= clock_timestamp() OR l.token IS NULL
        RETURNING fence)
    SELECT fence FROM acq";
const SQL_RELEASE: &str =
    "UPDATE bench_lease SET token = NULL, expires_at = clock_timestamp() WHERE key = $1 AND token = $2";
/// SQL_RELEASE, also setting synchronous_commit = off for the rest of its transaction (as SET LOCAL
/// would, but in the same statement and round trip): its commit does not wait for the flush.
const SQL_RELEASE_UNFLUSHED: &str = "
    UPDATE bench_lease SET token = NULL, expires_at = clock_timestamp()
     WHERE key = $1 AND token = $2 AND set_config('synchronous_commit', 'off', true) IS NOT NULL";

/// Redis's compare-and-delete release: delete the key only if it still holds our token.
const REDIS_RELEASE: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

/// One client's connection and how it does a pair; returns whether the acquire was granted.
enum Session {
    /// The client (boxed: it is most of the enum's size), and its two statements prepared once (as
    /// pgbench -M prepared does).
    Postgres(Box<Client>, System, [postgres::Statement; 2]),
    Redis(Resp, String),
}

#[derive(Clone, Copy, PartialEq)]
enum System {
    Fence,
    SqlLease,
    SqlLeaseOneFlush,
    Advisory,
}

impl Session {
    fn connect(system: &str, port: u16) -> Session {
        let pg = |system| {
            let database = std::env::var("PAIRS_DATABASE").unwrap_or_else(|_| "postgres".into());
            let config = format!("host=127.0.0.1 port={port} user=postgres dbname={database}");
            let mut client = Client::connect(&config, NoTls).expect("connect");
            let [acquire, release] = match system {
                System::Fence => [
                    "SELECT token FROM fence.lease_acquire($1, '30 seconds')",
                    "SELECT fence.lease_release($1, $2)",
                ],
                System::SqlLease => [SQL_ACQUIRE, SQL_RELEASE],
                System::SqlLeaseOneFlush => [SQL_ACQUIRE, SQL_RELEASE_UNFLUSHED],
                System::Advisory => ["SELECT pg_advisory_lock($1)", "SELECT pg_advisory_unlock($1)"],
            };
            let statements = [client.prepare(acquire).unwrap(), client.prepare(release).unwrap()];
            Session::Postgres(Box::new(client), system, statements)
        };
        match system {
            "fence" => pg(System::Fence),
            "sql_lease" => pg(System::SqlLease),
            "sql_lease_1flush" => pg(System::SqlLeaseOneFlush),
            "advisory" => pg(System::Advisory),
            "redis" => {
                let mut resp = Resp::connect(port);
                let sha = resp.command(&["SCRIPT", "LOAD", REDIS_RELEASE]);
                Session::Redis(resp, sha)
            }
            other => panic!("unknown system {other}"),
        }
    }

    fn pair(&mut self, key: u32) -> bool {
        let key = format!("k{key}");
        match self {
            Session::Postgres(client, System::Fence, [acquire, release]) => {
                let token: Option<Uuid> = client.query_one(&*acquire, &[&key]).unwrap().get(0);
                if let Some(token) = token {
                    client.query_one(&*release, &[&key, &token]).unwrap();
                }
                token.is_some()
            }
            Session::Postgres(client, System::SqlLease | System::SqlLeaseOneFlush, [acquire, release]) => {
                let token = Uuid::from_u128(rand::random());
                let granted = client.query_opt(&*acquire, &[&key, &token]).unwrap().is_some();
                if granted {
                    client.execute(&*release, &[&key, &token]).unwrap();
                }
                granted
            }
            Session::Postgres(client, System::Advisory, [lock, unlock]) => {
                let id = i64::from(key[1..].parse::<u32>().unwrap());
                client.query_one(&*lock, &[&id]).unwrap();
                client.query_one(&*unlock, &[&id]).unwrap();
                true
            }
            Session::Redis(resp, sha) => {
                let token = Uuid::from_u128(rand::random()).to_string();
                let granted = resp.command(&["SET", &key, &token, "NX", "PX", "30000"]) == "OK";
                if granted {
                    resp.command(&["EVALSHA", sha, "1", &key, &token]);
                }
                granted
            }
        }
    }
}

/// Just enough of the Redis protocol (RESP2) for the commands above.
struct Resp {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Resp {
    fn connect(port: u16) -> Resp {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to redis");
        stream.set_nodelay(true).unwrap();
        Resp { reader: BufReader::new(stream.try_clone().unwrap()), writer: stream }
    }

    /// Sends one command; returns a simple or bulk string reply, or an integer as text ("" for nil).
    fn command(&mut self, args: &[&str]) -> String {
        let mut request = format!("*{}\r\n", args.len());
        for arg in args {
            request += &format!("${}\r\n{arg}\r\n", arg.len());
        }
        self.writer.write_all(request.as_bytes()).unwrap();
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        let (kind, rest) = line.trim_end().split_at(1);
        match kind {
            "+" | ":" => rest.to_string(),
            "$" if rest == "-1" => String::new(),
            "$" => {
                let mut value = vec![0; rest.parse::<usize>().unwrap() + 2];
                std::io::Read::read_exact(&mut self.reader, &mut value).unwrap();
                String::from_utf8_lossy(&value[..value.len() - 2]).into_owned()
            }
            _ => panic!("redis error: {line}"),
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, system, clients, seconds, keys, port] = &args[..] else {
        panic!("usage: pairs SYSTEM CLIENTS SECONDS KEYS PORT");
    };
    let (clients, keys): (usize, u32) = (clients.parse().unwrap(), keys.parse().unwrap());
    let duration = Duration::from_secs_f64(seconds.parse().unwrap());
    let port: u16 = port.parse().unwrap();
    let refused = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..clients)
        .map(|_| {
            let (system, refused) = (system.clone(), refused.clone());
            thread::spawn(move || {
                let mut session = Session::connect(&system, port);
                let mut rng = rand::thread_rng();
                let mut latencies_us = Vec::new();
                let end = Instant::now() + duration;
                while Instant::now() < end {
                    let start = Instant::now();
                    if !session.pair(rng.gen_range(1..=keys)) {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                    latencies_us.push(start.elapsed().as_micros() as u64);
                }
                latencies_us
            })
        })
        .collect();
    let mut latencies: Vec<u64> = workers.into_iter().flat_map(|worker| worker.join().unwrap()).collect();
    latencies.sort_unstable();
    let percentile = |p: f64| latencies[((latencies.len() - 1) as f64 * p) as usize] as f64 / 1000.0;
    println!(
        "{system} {clients} {:.0} {:.3} {:.3} {}",
        latencies.len() as f64 / duration.as_secs_f64(),
        percentile(0.5),
        percentile(0.99),
        refused.load(Ordering::Relaxed)
    );
}
