//! What the examples share: arguments, the counts they print, and the "chaos" that takes leases
//! away from their holders so that there is something to count.
#![allow(dead_code)]
use pg_fence_client::{
    hold, hold_all, AcquireOptions, Connector, Error, Held, HeldLease, HeldLeaseSet, KeepOptions,
    PgConnection,
};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio_postgres::Config;
use tokio_util::sync::CancellationToken;

pub struct Args {
    pub config: Config,
    pub seconds: u64,
}

/// `<conninfo> [--seconds N]`; the conninfo defaults to the local server as postgres.
pub fn args() -> Args {
    let mut conninfo = "host=127.0.0.1 user=postgres dbname=postgres".to_string();
    let mut seconds = 10;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seconds" => seconds = args.next().and_then(|s| s.parse().ok()).expect("--seconds N"),
            _ => conninfo = arg,
        }
    }
    Args { config: conninfo.parse().expect("a conninfo string"), seconds }
}

pub async fn connect(config: &Config) -> PgConnection {
    Connector::connect(config).await.expect("connect")
}

/// A plain client, for the example's own transactions (they need `&mut Client`).
pub async fn plain(config: &Config) -> tokio_postgres::Client {
    let (client, connection) = config.connect(tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(connection);
    client
}

/// The counts every example prints at the end.
#[derive(Default)]
pub struct Stats {
    pub writes: AtomicU64,
    pub stale_refused: AtomicU64,
    pub lost: AtomicU64,
    /// When the last lease was taken away (by `chaos`), to time how long its holder took to learn it.
    taken_at: Mutex<Option<Instant>>,
    told_after: Mutex<Vec<Duration>>,
}

impl Stats {
    pub fn taken(&self) {
        *self.taken_at.lock().unwrap() = Some(Instant::now());
    }

    /// A holder learnt its lease is gone (from the keeper, or from a refused write).
    pub fn told(&self) {
        self.lost.fetch_add(1, Ordering::Relaxed);
        if let Some(taken) = self.taken_at.lock().unwrap().take() {
            self.told_after.lock().unwrap().push(taken.elapsed());
        }
    }

    /// Counts a fenced write that committed.
    pub fn wrote(&self) {
        self.writes.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a stale write; any other error is the example's bug.
    pub fn refused(&self, result: Result<i64, Error>) -> Result<i64, ()> {
        match result {
            Ok(rows) => {
                self.writes.fetch_add(1, Ordering::Relaxed);
                Ok(rows)
            }
            Err(Error::StaleFence { .. }) => {
                self.stale_refused.fetch_add(1, Ordering::Relaxed);
                Err(())
            }
            Err(err) => panic!("write failed: {err}"),
        }
    }

    pub fn print(&self, example: &str) {
        let mut told = self.told_after.lock().unwrap().clone();
        told.sort();
        let ms = |d: &Duration| format!("{:.1} ms", d.as_secs_f64() * 1000.0);
        let summary = match (told.first(), told.get(told.len() / 2), told.last()) {
            (Some(min), Some(median), Some(max)) => {
                format!("min {} / median {} / max {} over {}", ms(min), ms(median), ms(max), told.len())
            }
            _ => "none measured".into(),
        };
        println!("{example}: fenced writes {}", self.writes.load(Ordering::Relaxed));
        println!("{example}: stale writes refused {}", self.stale_refused.load(Ordering::Relaxed));
        println!("{example}: leases declared lost {}", self.lost.load(Ordering::Relaxed));
        println!("{example}: loss to told: {summary}");
    }
}

/// Every `every`, ends the lease on `key` behind its holder's back with `sql` (a revoke, or a
/// terminated session), until `until`.
pub async fn chaos(
    config: Config,
    sql: &'static str,
    key: String,
    every: Duration,
    until: Instant,
    stats: &Stats,
) {
    let admin = connect(&config).await;
    while Instant::now() + every < until {
        tokio::time::sleep(every).await;
        let row = admin.query_opt(sql, &[&key]).await.expect("chaos");
        if row.and_then(|row| row.get::<_, Option<bool>>(0)) == Some(true) {
            stats.taken();
        }
    }
}

/// How an example takes leases away: `sql` (with the key as $1) every `every`.
pub struct Chaos {
    pub sql: &'static str,
    pub key: &'static str,
    pub every: Duration,
}

/// Creates the example's tables with `setup`, runs `workers` copies of `worker` and the chaos until
/// the --seconds are up, and prints the counts.
pub async fn run_example<F, Fut>(name: &str, setup: &str, workers: usize, chaos_by: Chaos, worker: F)
where
    F: Fn(Config, usize, Instant, Arc<Stats>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let args = args();
    connect(&args.config).await.batch_execute(setup).await.expect("create the tables");
    let until = Instant::now() + Duration::from_secs(args.seconds);
    let stats = Arc::new(Stats::default());
    let tasks: Vec<_> =
        (0..workers).map(|n| tokio::spawn(worker(args.config.clone(), n, until, stats.clone()))).collect();
    chaos(args.config.clone(), chaos_by.sql, chaos_by.key.into(), chaos_by.every, until, &stats).await;
    for task in tasks {
        task.await.unwrap();
    }
    stats.print(name);
}

/// `hold`, or None when the wait ran out.
pub async fn next_lease(config: &Config, key: &str, opts: &AcquireOptions) -> Option<HeldLease> {
    granted(hold(config.clone(), key, opts, KeepOptions::default()).await)
}

/// `hold_all`, or None when the wait ran out.
pub async fn next_set(config: &Config, keys: &[String], opts: &AcquireOptions) -> Option<HeldLeaseSet> {
    granted(hold_all(config.clone(), keys, opts, KeepOptions::default()).await)
}

/// What was granted, or None when nothing was: the wait ran out, or the chaos took it away before
/// `hold` returned (it renews at once after a long wait).
fn granted<T>(held: Result<Held<T>, Error>) -> Option<Held<T>> {
    match held {
        Ok(held) => Some(held),
        Err(Error::WaitTimedOut { .. } | Error::LeaseLost { .. }) => None,
        Err(err) => panic!("{err}"),
    }
}

/// The work between two steps, `pause` long, cut short when the lease is lost (counted as told):
/// false then.
pub async fn work(lost: &CancellationToken, pause: Duration, stats: &Stats) -> bool {
    tokio::select! {
        _ = lost.cancelled() => { stats.told(); false }
        _ = tokio::time::sleep(pause) => true,
    }
}

/// `lease::fence_guard` of each key at its fence in `tx`: false (counted as a stale write refused,
/// and the holder told) when one of them is stale.
pub async fn guarded(tx: &tokio_postgres::Transaction<'_>, fences: &[(&str, i64)], stats: &Stats) -> bool {
    for (key, fence) in fences {
        if let Err(err) = pg_fence_client::lease::fence_guard(tx, key, *fence).await {
            let _ = stats.refused(Err(err));
            stats.told();
            return false;
        }
    }
    true
}
