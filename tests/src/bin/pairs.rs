//! Load generator for the benchmark (pg_test/run-bench): N clients each doing acquire+release pairs
//! on random keys, against one lock system, for a fixed time; prints throughput and the latency of
//! a pair (p50, p99). One client program for every system, so their numbers compare.
//!
//!   pairs SYSTEM CLIENTS SECONDS KEYS PORT
//!
//! SYSTEM: fence (pg_fence), fence_fast (pg_fence's fast leases, `durable => false`), fence_sql
//! (the SQL edition's durable leases: the same statements as fence's, sent to a cluster that serves
//! the SQL edition, sql/edition/),
//! fence_shared (shared leases, `shared => true`), fence_permits (a permit of a semaphore of 3,
//! `permits => 3`), fence_set3 (a lease set of 3 keys: the key, key/b and key/c, through
//! lease_acquire_all and lease_release_all), sql_lease (the same fenced lease by hand in SQL), sql_lease_1flush
//! (the same, its release committed without waiting for a flush: one flush per pair, as pg_fence
//! spends, but none of pg_fence's code), sql_lease_unlogged (the same lease in an unlogged table:
//! the floor under fast leases, no WAL but commit records), advisory (pg_advisory_lock/unlock), redis (SET NX PX +
//! compare-and-delete script), etcd (the lock of etcd's clientv3/concurrency Mutex over gRPC: a
//! transaction that creates the key only if absent, under the client's session lease, then a delete;
//! only when built with the `etcd` feature). PORT is PostgreSQL's, or Redis's for redis, or etcd's
//! client port for etcd; PAIRS_DATABASE names the database (default postgres). KEYS: a number N,
//! for random keys of k1..kN; `reused`, for 100 keys per client, each client its own (client c:
//! k(100c+1)..k(100c+100)); or `new`, for a key never used before at every pair.
//! Output: "SYSTEM CLIENTS pairs/s p50_ms p99_ms refused".
use pg_fence_integration::bench;
use postgres::Client;
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
    #[cfg(feature = "etcd")]
    Etcd(Box<etcd::Session>),
}

#[derive(Clone, Copy, PartialEq)]
enum System {
    Fence,
    FenceFast,
    FenceShared,
    FencePermits,
    FenceSet3,
    SqlLease,
    SqlLeaseOneFlush,
    SqlLeaseUnlogged,
    Advisory,
}

impl Session {
    /// `run`: how long the client will run (the etcd session's lease must outlive it).
    fn connect(system: &str, port: u16, run: Duration) -> Session {
        let pg = |system| {
            let database = std::env::var("PAIRS_DATABASE").unwrap_or_else(|_| "postgres".into());
            let mut client = bench::connect(port, &database);
            let [acquire, release] = match system {
                System::Fence => [
                    "SELECT token FROM fence.lease_acquire($1, '30 seconds')",
                    "SELECT fence.lease_release($1, $2)",
                ],
                System::FenceFast => [
                    "SELECT token FROM fence.lease_acquire($1, '30 seconds', durable => false)",
                    "SELECT fence.lease_release($1, $2)",
                ],
                System::FenceShared => [
                    "SELECT token FROM fence.lease_acquire($1, '30 seconds', shared => true)",
                    "SELECT fence.lease_release($1, $2)",
                ],
                System::FencePermits => [
                    "SELECT token FROM fence.lease_acquire($1, '30 seconds', permits => 3)",
                    "SELECT fence.lease_release($1, $2)",
                ],
                System::FenceSet3 => [
                    "SELECT min(token::text)::uuid FROM fence.lease_acquire_all(ARRAY[$1, $1 || '/b', $1 || '/c'], '30 seconds')",
                    "SELECT fence.lease_release_all(ARRAY[$1, $1 || '/b', $1 || '/c'], $2)",
                ],
                System::SqlLease => [SQL_ACQUIRE, SQL_RELEASE],
                System::SqlLeaseUnlogged => {
                    let unlogged = |sql: &str| sql.replace("bench_lease", "bench_lease_unlogged");
                    let statements = [unlogged(SQL_ACQUIRE), unlogged(SQL_RELEASE)];
                    let prepared =
                        [client.prepare(&statements[0]).unwrap(), client.prepare(&statements[1]).unwrap()];
                    return Session::Postgres(Box::new(client), system, prepared);
                }
                System::SqlLeaseOneFlush => [SQL_ACQUIRE, SQL_RELEASE_UNFLUSHED],
                System::Advisory => ["SELECT pg_advisory_lock($1)", "SELECT pg_advisory_unlock($1)"],
            };
            let statements = [client.prepare(acquire).unwrap(), client.prepare(release).unwrap()];
            Session::Postgres(Box::new(client), system, statements)
        };
        match system {
            // The same calls: only the server (PORT) tells the editions apart.
            "fence" | "fence_sql" => pg(System::Fence),
            "fence_fast" => pg(System::FenceFast),
            "fence_shared" => pg(System::FenceShared),
            "fence_permits" => pg(System::FencePermits),
            "fence_set3" => pg(System::FenceSet3),
            "sql_lease" => pg(System::SqlLease),
            "sql_lease_1flush" => pg(System::SqlLeaseOneFlush),
            "sql_lease_unlogged" => pg(System::SqlLeaseUnlogged),
            "advisory" => pg(System::Advisory),
            "redis" => {
                let mut resp = Resp::connect(port);
                let sha = resp.command(&["SCRIPT", "LOAD", REDIS_RELEASE]);
                Session::Redis(resp, sha)
            }
            #[cfg(feature = "etcd")]
            "etcd" => Session::Etcd(Box::new(etcd::Session::connect(port, run))),
            #[cfg(not(feature = "etcd"))]
            "etcd" => {
                let _ = run;
                panic!("etcd: pairs was built without the `etcd` feature (cargo build --features etcd)")
            }
            other => panic!("unknown system {other}"),
        }
    }

    fn pair(&mut self, key: Key) -> bool {
        let (key, id) = match key {
            Key::Numbered(n) => (format!("k{n}"), i64::from(n)),
            Key::New(client, n) => (format!("new-{client}-{n}"), ((client as i64) << 40) | n as i64),
        };
        match self {
            Session::Postgres(
                client,
                System::Fence
                | System::FenceFast
                | System::FenceShared
                | System::FencePermits
                | System::FenceSet3,
                [acquire, release],
            ) => {
                let token: Option<Uuid> = client.query_one(&*acquire, &[&key]).unwrap().get(0);
                if let Some(token) = token {
                    client.query_one(&*release, &[&key, &token]).unwrap();
                }
                token.is_some()
            }
            Session::Postgres(
                client,
                System::SqlLease | System::SqlLeaseOneFlush | System::SqlLeaseUnlogged,
                [acquire, release],
            ) => {
                let token = Uuid::from_u128(rand::random());
                let granted = client.query_opt(&*acquire, &[&key, &token]).unwrap().is_some();
                if granted {
                    client.execute(&*release, &[&key, &token]).unwrap();
                }
                granted
            }
            Session::Postgres(client, System::Advisory, [lock, unlock]) => {
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
            #[cfg(feature = "etcd")]
            Session::Etcd(session) => session.pair(&key),
        }
    }
}

/// The key of one pair.
#[derive(Clone, Copy)]
enum Key {
    /// k1, k2, ...
    Numbered(u32),
    /// The nth key of a client, never used before (in this run: `new` keys carry the run's start
    /// time, so that runs one after another do not meet their predecessors' keys either).
    New(usize, u64),
}

/// Which keys a client's pairs use (the KEYS argument).
enum Keys {
    Random(u32),
    Reused,
    New(u64),
}

impl Keys {
    fn parse(arg: &str) -> Keys {
        match arg {
            "reused" => Keys::Reused,
            "new" => Keys::New(
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_micros()
                    as u64
                    * 1_000_000,
            ),
            n => Keys::Random(n.parse().expect("KEYS: a number, reused or new")),
        }
    }

    fn pick(&self, client: usize, pair: u64, rng: &mut impl Rng) -> Key {
        match *self {
            Keys::Random(n) => Key::Numbered(rng.gen_range(1..=n)),
            Keys::Reused => Key::Numbered(client as u32 * 100 + rng.gen_range(1..=100)),
            Keys::New(start) => Key::New(client, start + pair),
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

#[cfg(feature = "etcd")]
mod etcd {
    use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
    use std::time::Duration;
    use uuid::Uuid;

    /// One etcd client, as a concurrency.Session is: a connection and one lease that every key it
    /// takes is attached to, so that its keys go when the client dies.
    pub struct Session {
        /// pairs.rs's clients are threads: each drives its own gRPC connection on a runtime of its
        /// own, so that no client waits for another's thread.
        runtime: tokio::runtime::Runtime,
        client: Client,
        lease: i64,
    }

    impl Session {
        pub fn connect(port: u16, run: Duration) -> Session {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let (client, lease) = runtime.block_on(async {
                let mut client = Client::connect([format!("http://127.0.0.1:{port}")], None)
                    .await
                    .expect("connect to etcd");
                // concurrency.Session keeps its lease (60 s by default) alive in the background; a
                // lease that outlives the run instead keeps those keep-alives, which do not go
                // through Raft, from competing with the pairs.
                let ttl = 60 + run.as_secs() as i64;
                let lease = client.lease_grant(ttl, None).await.expect("etcd lease grant").id();
                (client, lease)
            });
            Session { runtime, client, lease }
        }

        /// Acquire as concurrency.Mutex's tryAcquire does (one transaction: if the key's
        /// create_revision is 0, that is it does not exist, put it under our lease and read it back;
        /// else read the holder), then release. Mutex.Unlock deletes its key plainly, which is safe
        /// there because its key names its own lease; these keys are shared between clients, so the
        /// release is a transaction that deletes the key only if its create_revision is still the
        /// one our acquire made. Either way a pair is two Raft commits, each waiting for an fsync of
        /// etcd's WAL (one fsync each with one client; concurrent commits share one).
        pub fn pair(&mut self, key: &str) -> bool {
            let token = Uuid::from_u128(rand::random()).to_string();
            let Session { runtime, client, lease } = self;
            runtime.block_on(async {
                let acquire = Txn::new()
                    .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                    .and_then([
                        TxnOp::put(key, token.as_str(), Some(PutOptions::new().with_lease(*lease))),
                        TxnOp::get(key, None),
                    ])
                    .or_else([TxnOp::get(key, None)]);
                let response = client.txn(acquire).await.expect("etcd acquire");
                // A broken path must not pass for a fast one: a grant must have created our key, a
                // refusal must have found someone else's.
                let revision = response.header().expect("etcd txn header").revision();
                let responses = response.op_responses();
                let Some(TxnOpResponse::Get(got)) = responses.last() else {
                    panic!("etcd acquire: no read-back in {responses:?}")
                };
                let [held] = got.kvs() else {
                    panic!("etcd acquire of {key}: {} keys read back", got.kvs().len())
                };
                if !response.succeeded() {
                    assert_ne!(held.value(), token.as_bytes(), "etcd acquire of {key}: refused, yet ours");
                    return false;
                }
                assert!(
                    held.value() == token.as_bytes()
                        && held.lease() == *lease
                        && held.create_revision() == revision,
                    "etcd acquire of {key}: granted, but the key is not the one we created: {held:?}"
                );
                let release = Txn::new()
                    .when([Compare::create_revision(key, CompareOp::Equal, revision)])
                    .and_then([TxnOp::delete(key, None)]);
                let response = client.txn(release).await.expect("etcd release");
                let deleted = match response.op_responses().as_slice() {
                    [TxnOpResponse::Delete(deleted)] if response.succeeded() => deleted.deleted(),
                    other => panic!("etcd release of {key}: not ours any more ({other:?})"),
                };
                assert_eq!(deleted, 1, "etcd release of {key}: {deleted} keys deleted");
                true
            })
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, system, clients, seconds, keys, port] = &args[..] else {
        panic!("usage: pairs SYSTEM CLIENTS SECONDS KEYS PORT");
    };
    let clients: usize = clients.parse().unwrap();
    let keys = Arc::new(Keys::parse(keys));
    let duration = Duration::from_secs_f64(seconds.parse().unwrap());
    let port: u16 = port.parse().unwrap();
    let refused = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..clients)
        .map(|client| {
            let (system, refused, keys) = (system.clone(), refused.clone(), keys.clone());
            thread::spawn(move || {
                let mut session = Session::connect(&system, port, duration);
                let mut rng = rand::thread_rng();
                let mut latencies_us = Vec::new();
                let end = Instant::now() + duration;
                let mut pair = 0;
                while Instant::now() < end {
                    let start = Instant::now();
                    pair += 1;
                    if !session.pair(keys.pick(client, pair, &mut rng)) {
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
    let percentile = |p: f64| bench::percentile(&latencies, p) as f64 / 1000.0;
    println!(
        "{system} {clients} {:.0} {:.3} {:.3} {}",
        latencies.len() as f64 / duration.as_secs_f64(),
        percentile(0.5),
        percentile(0.99),
        refused.load(Ordering::Relaxed)
    );
}
