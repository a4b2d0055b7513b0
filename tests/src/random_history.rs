//! Histories made up at random, for the rule that fences never go back (invariant 1) on every
//! history docs/guarantees.md names. A seeded driver composes grants of every kind and mode
//! (exclusive, shared and permit leases, lease sets, lock-delays, waits that a release ends) on several backends with what the server can be put through: steps of its wall
//! clock back and forward (tens of minutes, seconds, and runs of small steps that slew it), kill -9,
//! immediate and clean shutdowns, with fast leases in shared memory or in the table (switched
//! across restarts), sweeps that delete ended rows, revokes, new backends, and DROP and CREATE
//! EXTENSION.
//!
//! The driver makes one call at a time (a waiter's thread is joined before the next step), so "told
//! before" is exact: every fence a call returned was told before every later call. After each grant:
//! - its fence is above every fence told before for its key;
//! - after an exclusive grant, no other token of the key renews (two live holders, as the server
//!   judges it);
//! - a `fenced_write` under its fence is accepted, and one under the fence told before it for the
//!   key is refused (PF002): no stale write lands, and the new holder's is not refused.
//!
//! The one clock assumption (docs/guarantees.md): a history that forgets grants runs a clock that
//! reads later than their fences at each key's first grant. Only DROP and CREATE EXTENSION forget
//! here (a crash forgets fast leases, whose fences the reservation covers); the driver steps the
//! clock past every fence told, then grants each key. A failure names its seed: `RANDOM_HISTORY_SEED=N` replays the same choices.
use crate::fake_clock::FakeClock;
use crate::{eventually, sqlstate, Acquire, Cluster};
use postgres::Client;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use uuid::Uuid;

/// What a run does.
pub struct Config<'a> {
    pub name: &'a str,
    pub port: u16,
    pub duration: Duration,
    pub seed: u64,
}

/// How a key is used: by exclusive leases only (alone and in sets), by shared ones beside
/// exclusive ones, or as a semaphore.
#[derive(Clone, Copy, PartialEq)]
enum Use {
    Exclusive,
    SharedOrExclusive,
    Permits(i32),
}

/// Lease sets take two of the four exclusive keys.
const KEYS: [(&str, Use); 6] = [
    ("x-0", Use::Exclusive),
    ("x-1", Use::Exclusive),
    ("x-2", Use::Exclusive),
    ("x-3", Use::Exclusive),
    ("s-0", Use::SharedOrExclusive),
    ("p-0", Use::Permits(2)),
];
const BACKENDS: usize = 4;
/// The last steps kept for a failure's report.
const LOG_LENGTH: usize = 60;

/// What the run did.
#[derive(Debug, Default)]
pub struct Counts {
    pub steps: u64,
    pub grants: u64,
    pub fast_grants: u64,
    pub shared_grants: u64,
    pub permit_grants: u64,
    pub sets: u64,
    pub woken_by_release: u64,
    pub refused: u64,
    pub renewals: u64,
    pub releases: u64,
    pub steps_back: u64,
    pub steps_forward: u64,
    pub slews: u64,
    pub crashes: u64,
    pub immediate_shutdowns: u64,
    pub clean_shutdowns: u64,
    pub store_switches: u64,
    pub sweeps: u64,
    pub revokes: u64,
    pub lock_delays: u64,
    pub new_backends: u64,
    pub drop_and_create: u64,
    /// The longest step back of the clock (s), and how far below the highest fence told a grant's
    /// clock reading was at most (s): the histories must have put fences above the clock.
    pub longest_step_back_s: f64,
    pub most_behind_fences_s: f64,
}

impl fmt::Display for Counts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} steps: grants {} (fast {}, shared {}, permits {}, sets {}, woken by a release {}), \
             refused {}, renewals {}, releases {}; clock steps back {}, forward {}, slews {} (longest \
             step back {:.0} s; grants up to {:.0} s behind the highest fence told); kill -9 {}, immediate \
             shutdowns {}, clean shutdowns {}, fast-store switches {}; sweeps {}, revokes {}, \
             lock-delays {}, new backends {}, DROP/CREATE EXTENSION {}",
            self.steps,
            self.grants,
            self.fast_grants,
            self.shared_grants,
            self.permit_grants,
            self.sets,
            self.woken_by_release,
            self.refused,
            self.renewals,
            self.releases,
            self.steps_back,
            self.steps_forward,
            self.slews,
            self.longest_step_back_s,
            self.most_behind_fences_s,
            self.crashes,
            self.immediate_shutdowns,
            self.clean_shutdowns,
            self.store_switches,
            self.sweeps,
            self.revokes,
            self.lock_delays,
            self.new_backends,
            self.drop_and_create,
        )
    }
}

/// A lease the driver was told it holds.
#[derive(Clone)]
struct Held {
    key: String,
    token: Uuid,
    fence: i64,
}

/// Runs a random history for `config.duration`; panics at the first broken rule, with the seed and
/// the steps that led there. Returns what it did.
pub fn run(config: &Config<'_>) -> Counts {
    // Named by its port too: runs side by side (PG_FENCE_PORT_OFFSET) must not share a clock.
    let clock = FakeClock::new(&format!("{}_{}", config.name, crate::port(config.port)));
    let cluster = clock.start_cluster(
        config.name,
        config.port,
        &["shared_preload_libraries=pg_fence", "pg_fence.sweep_interval=500ms"],
    );
    let mut driver = Driver {
        seed: config.seed,
        rng: StdRng::seed_from_u64(config.seed),
        cluster: &cluster,
        clock: &clock,
        offset: 0.0,
        backends: (0..BACKENDS).map(|_| None).collect(),
        held: Vec::new(),
        told: HashMap::new(),
        highest_told: 0,
        fast_in_table: crate::edition() == crate::Edition::Sql,
        log: VecDeque::new(),
        counts: Counts::default(),
    };
    println!("random history: seed {} (RANDOM_HISTORY_SEED={} replays it)", config.seed, config.seed);
    let keys: Vec<&str> = KEYS.iter().map(|(key, _)| *key).collect();
    cluster
        .connect()
        .execute(
            "CREATE TABLE rh_resource AS SELECT key, NULL::bigint AS fence, '' AS last FROM unnest($1::text[]) key",
            &[&keys],
        )
        .unwrap();
    let deadline = Instant::now() + config.duration;
    while Instant::now() < deadline {
        driver.step();
    }
    driver.counts
}

struct Driver<'a> {
    seed: u64,
    rng: StdRng,
    cluster: &'a Cluster,
    clock: &'a FakeClock,
    /// The server clock's offset from the real one, in seconds.
    offset: f64,
    backends: Vec<Option<Client>>,
    held: Vec<Held>,
    /// The highest fence told per key.
    told: HashMap<String, i64>,
    highest_told: i64,
    /// Whether fast leases are in the unlogged table (pg_fence.fast_leases = 0) since the last start.
    fast_in_table: bool,
    log: VecDeque<String>,
    counts: Counts,
}

impl Driver<'_> {
    fn step(&mut self) {
        self.counts.steps += 1;
        match self.rng.gen_range(0..100) {
            0..=5 => self.grant_set(),
            6..=10 => self.wait_for_a_release(),
            11..=25 => self.release_or_renew(),
            26..=37 => self.step_clock(),
            38..=43 => self.new_backend(),
            44..=47 => self.server_fault(),
            48..=52 => self.sweep(),
            53..=55 => self.revoke(),
            _ => self.grant(),
        }
        // DROP and CREATE EXTENSION is rare: it forgets everything, which is what makes it strong.
        if self.rng.gen_bool(0.01) {
            self.drop_and_create();
        }
    }

    fn note(&mut self, what: String) {
        if self.log.len() == LOG_LENGTH {
            self.log.pop_front();
        }
        self.log.push_back(what);
    }

    fn fail(&self, what: String) -> ! {
        let steps: Vec<&str> = self.log.iter().map(String::as_str).collect();
        panic!(
            "{what}\nseed {} (replay: RANDOM_HISTORY_SEED={}); the last steps:\n  {}\n{}",
            self.seed,
            self.seed,
            steps.join("\n  "),
            self.counts
        );
    }

    fn backend(&mut self, index: usize) -> &mut Client {
        if self.backends[index].is_none() {
            let client =
                self.cluster.try_connect().unwrap_or_else(|err| self.fail(format!("connect: {err}")));
            self.backends[index] = Some(client);
        }
        self.backends[index].as_mut().unwrap()
    }

    fn any_backend(&mut self) -> (usize, &mut Client) {
        let index = self.rng.gen_range(0..BACKENDS);
        (index, self.backend(index))
    }

    /// The rules of every grant (see the module's comment); records its fence as told.
    fn granted(&mut self, how: &str, lease: Held, exclusive: bool) {
        self.counts.grants += 1;
        let clock_us = (now_s() + self.offset) * 1e6;
        if let Some(&told) = self.told.get(&lease.key) {
            if lease.fence <= told {
                self.fail(format!(
                    "{how}: {} was granted fence {}, {} below fence {told} told before",
                    lease.key,
                    lease.fence,
                    told - lease.fence
                ));
            }
        }
        self.counts.most_behind_fences_s =
            self.counts.most_behind_fences_s.max((self.highest_told as f64 - clock_us) / 1e6);
        let told_before = self.told.insert(lease.key.clone(), lease.fence);
        self.write_under(how, &lease, told_before);
        self.highest_told = self.highest_told.max(lease.fence);
        self.note(format!("{how}: {} fence {} (clock {:+.3} s)", lease.key, lease.fence, self.offset));
        if exclusive {
            let others: Vec<Held> =
                self.held.iter().filter(|h| h.key == lease.key && h.token != lease.token).cloned().collect();
            for other in others {
                let (index, client) = self.any_backend();
                match client
                    .query_one("SELECT fence.lease_renew($1, $2, '1 hour')", &[&other.key, &other.token])
                {
                    Ok(_) => self.fail(format!(
                        "{how}: {} granted exclusively under fence {}, yet the lease of fence {} renews \
                         (backend {index})",
                        lease.key, lease.fence, other.fence
                    )),
                    Err(err) if sqlstate(&err) == "PF001" => {}
                    Err(err) => self.unexpected("renew of a taken-over lease", err),
                }
            }
            self.held.retain(|h| h.key != lease.key);
        }
        self.held.push(lease);
    }

    /// The new holder writes under its fence (accepted), then a holder of the fence told before it
    /// for the key tries to (refused).
    fn write_under(&mut self, how: &str, lease: &Held, told_before: Option<i64>) {
        const WRITE: &str = "SELECT fence.fenced_write('rh_resource', 'fence', $1, \
                             jsonb_build_object('last', $2::text), jsonb_build_object('key', $3::text))";
        let (index, client) = self.any_backend();
        match client.query_one(WRITE, &[&lease.fence, &how, &lease.key]) {
            Ok(_) => {}
            Err(err) if sqlstate(&err) == "PF002" => self.fail(format!(
                "{how}: the holder of {} under fence {} had its write refused (backend {index})",
                lease.key, lease.fence
            )),
            Err(err) => self.unexpected("fenced_write", err),
        }
        let Some(stale) = told_before else { return };
        let (index, client) = self.any_backend();
        match client.query_one(WRITE, &[&stale, &"stale", &lease.key]) {
            Ok(_) => self.fail(format!(
                "{how}: a write under fence {stale} of {} landed after fence {} was told (backend {index})",
                lease.key, lease.fence
            )),
            Err(err) if sqlstate(&err) == "PF002" => {}
            Err(err) => self.unexpected("fenced_write", err),
        }
    }

    fn unexpected(&mut self, what: &str, err: postgres::Error) -> ! {
        self.fail(format!("{what}: unexpected error {err:?}"))
    }

    fn grant(&mut self) {
        let (key, used) = KEYS[self.rng.gen_range(0..KEYS.len())];
        let durable = self.rng.gen_bool(0.5);
        let ttl = if self.rng.gen_bool(0.5) { "1 hour" } else { "20 seconds" };
        let lock_delay = if self.rng.gen_bool(0.05) { "3 seconds" } else { "0" };
        let shared = used == Use::SharedOrExclusive && self.rng.gen_bool(0.7);
        let permits = match used {
            Use::Permits(permits) => permits,
            _ => 1,
        };
        let call =
            Acquire::new(key, ttl).durable(durable).shared(shared).permits(permits).lock_delay(lock_delay);
        let (index, client) = self.any_backend();
        match call.try_run(client) {
            Ok(Some(lease)) => {
                self.counts.fast_grants += u64::from(!durable);
                self.counts.shared_grants += u64::from(shared);
                self.counts.permit_grants += u64::from(permits > 1);
                self.counts.lock_delays += u64::from(lock_delay != "0");
                let how = format!(
                    "backend {index} {} {}{}",
                    if durable { "durable" } else { "fast" },
                    if shared {
                        "shared"
                    } else if permits > 1 {
                        "permit"
                    } else {
                        "exclusive"
                    },
                    if lock_delay != "0" { " lock-delay" } else { "" }
                );
                let exclusive = !shared && permits == 1;
                self.granted(
                    &how,
                    Held { key: key.into(), token: lease.token, fence: lease.fence },
                    exclusive,
                );
            }
            Ok(None) => {
                self.counts.refused += 1;
                self.note(format!("backend {index}: {key} refused"));
            }
            Err(err) => self.unexpected(&format!("backend {index}: acquire {key}"), err),
        }
    }

    fn grant_set(&mut self) {
        let durable = self.rng.gen_bool(0.5);
        let first = self.rng.gen_range(0..4);
        let keys = vec![format!("x-{first}"), format!("x-{}", (first + self.rng.gen_range(1..4)) % 4)];
        let (index, client) = self.any_backend();
        let rows = client.query(
            "SELECT key, fence, token FROM fence.lease_acquire_all($1, '1 hour', durable => $2)",
            &[&keys, &durable],
        );
        match rows {
            Ok(rows) if rows.is_empty() => self.counts.refused += 1,
            Ok(rows) => {
                self.counts.sets += 1;
                self.counts.fast_grants += if durable { 0 } else { rows.len() as u64 };
                for row in rows {
                    let lease = Held { key: row.get(0), fence: row.get(1), token: row.get(2) };
                    let how = format!("backend {index} {} set", if durable { "durable" } else { "fast" });
                    self.granted(&how, lease, true);
                }
            }
            Err(err) => self.unexpected(&format!("backend {index}: acquire_all"), err),
        }
    }

    /// A waiter on a key the driver holds, woken by the driver's release of it.
    fn wait_for_a_release(&mut self) {
        let Some(holder) = self.held.iter().find(|h| h.key.starts_with('x')).cloned() else {
            return self.grant();
        };
        let durable = self.rng.gen_bool(0.5);
        let mut waiter_client =
            self.cluster.try_connect().unwrap_or_else(|err| self.fail(format!("connect: {err}")));
        let key = holder.key.clone();
        let waiter = thread::spawn(move || {
            Acquire::new(&key, "1 hour").durable(durable).wait("10 seconds").try_run(&mut waiter_client)
        });
        let (index, client) = self.any_backend();
        let waiting = eventually(Duration::from_secs(10), || {
            waiter.is_finished()
                || client
                    .query_one("SELECT fence.waiters($1)", &[&holder.key])
                    .is_ok_and(|row| row.get::<_, i32>(0) >= 1)
        }) && !waiter.is_finished();
        let released = client.query_one("SELECT fence.lease_release($1, $2)", &[&holder.key, &holder.token]);
        if let Err(err) = released {
            self.unexpected(&format!("backend {index}: release {}", holder.key), err);
        }
        self.held.retain(|h| h.token != holder.token);
        match waiter.join().unwrap() {
            Ok(Some(lease)) => {
                self.counts.woken_by_release += u64::from(waiting);
                self.counts.fast_grants += u64::from(!durable);
                let lease = Held { key: holder.key.clone(), token: lease.token, fence: lease.fence };
                let how = format!(
                    "a waiter ({}) after backend {index}'s release",
                    if durable { "durable" } else { "fast" }
                );
                self.granted(&how, lease, true);
            }
            Ok(None) => self.counts.refused += 1,
            Err(err) => self.unexpected("a waiter", err),
        }
    }

    fn release_or_renew(&mut self) {
        if self.held.is_empty() {
            return self.grant();
        }
        let lease = self.held[self.rng.gen_range(0..self.held.len())].clone();
        let release = self.rng.gen_bool(0.6);
        let (index, client) = self.any_backend();
        if release {
            match client.query_one("SELECT fence.lease_release($1, $2)", &[&lease.key, &lease.token]) {
                Ok(_) => self.counts.releases += 1,
                Err(err) => self.unexpected(&format!("backend {index}: release {}", lease.key), err),
            }
            self.held.retain(|h| h.token != lease.token);
            self.note(format!("backend {index}: released {} fence {}", lease.key, lease.fence));
        } else {
            match client.query_one("SELECT fence.lease_renew($1, $2, '1 hour')", &[&lease.key, &lease.token])
            {
                Ok(_) => self.counts.renewals += 1,
                Err(err) if sqlstate(&err) == "PF001" => self.held.retain(|h| h.token != lease.token),
                Err(err) => self.unexpected(&format!("backend {index}: renew {}", lease.key), err),
            }
        }
    }

    fn step_clock(&mut self) {
        let back = self.rng.gen_bool(0.55);
        let seconds = match self.rng.gen_range(0..10) {
            0..=2 => {
                self.counts.slews += 1;
                // A slewed clock, as small steps: each a fraction of a second.
                self.rng.gen_range(0.01..0.5)
            }
            3..=6 => self.rng.gen_range(1.0..60.0),
            _ => self.rng.gen_range(60.0..1800.0),
        };
        self.offset += if back { -seconds } else { seconds };
        if back {
            self.counts.steps_back += 1;
        } else {
            self.counts.steps_forward += 1;
        }
        if back {
            self.counts.longest_step_back_s = self.counts.longest_step_back_s.max(seconds);
        }
        let (offset, clock) = (self.offset, self.clock);
        let (_, client) = self.any_backend();
        clock.step_to(client, offset);
        self.note(format!(
            "clock stepped {} {seconds:.3} s to {offset:+.3} s",
            if back { "back" } else { "forward" }
        ));
    }

    fn new_backend(&mut self) {
        let index = self.rng.gen_range(0..BACKENDS);
        self.backends[index] = None;
        self.counts.new_backends += 1;
        self.note(format!("backend {index}: a new one"));
    }

    fn server_fault(&mut self) {
        // Sometimes the next start keeps fast leases in the other store.
        // (The SQL edition keeps them in the table always.)
        if self.rng.gen_bool(0.2) && crate::edition() == crate::Edition::Extension {
            let setting = if self.fast_in_table {
                "ALTER SYSTEM RESET pg_fence.fast_leases"
            } else {
                "ALTER SYSTEM SET pg_fence.fast_leases = 0"
            };
            let (_, client) = self.any_backend();
            client.batch_execute(setting).unwrap_or_else(|err| self.unexpected(setting, err));
            self.fast_in_table = !self.fast_in_table;
            self.counts.store_switches += 1;
        }
        let fault = match self.rng.gen_range(0..3) {
            0 => {
                self.cluster.crash();
                self.counts.crashes += 1;
                "kill -9"
            }
            1 => {
                self.cluster.stop("immediate");
                self.counts.immediate_shutdowns += 1;
                "immediate shutdown"
            }
            _ => {
                self.cluster.stop("fast");
                self.counts.clean_shutdowns += 1;
                "clean shutdown"
            }
        };
        self.backends.iter_mut().for_each(|backend| *backend = None);
        self.clock.restart(self.cluster);
        let store = if self.fast_in_table { "the table" } else { "shared memory" };
        self.note(format!("{fault} and restart (fast leases in {store})"));
    }

    fn sweep(&mut self) {
        let (index, client) = self.any_backend();
        let retain = if crate::edition() == crate::Edition::Sql {
            // The SQL edition's setting is fence.settings' (sql/edition/settings.sql).
            "UPDATE fence.settings SET value = '0' WHERE name = 'retain_ended'"
        } else {
            "SET pg_fence.retain_ended = 0"
        };
        let deleted = client
            .batch_execute(retain)
            .and_then(|()| client.query_one("SELECT fence.sweep()", &[]).map(|row| row.get::<_, i64>(0)));
        match deleted {
            Ok(deleted) => {
                self.counts.sweeps += 1;
                self.note(format!("backend {index}: sweep ({deleted})"));
            }
            Err(err) => self.unexpected("sweep", err),
        }
    }

    fn revoke(&mut self) {
        let (key, _) = KEYS[self.rng.gen_range(0..KEYS.len())];
        let (index, client) = self.any_backend();
        match client.query_one("SELECT fence.lease_revoke($1)", &[&key]) {
            Ok(row) => {
                self.counts.revokes += 1;
                self.note(format!("backend {index}: revoke {key} ({})", row.get::<_, bool>(0)));
            }
            Err(err) => self.unexpected("revoke", err),
        }
    }

    /// Forgets every lease and fence; the clock is first stepped past every fence told (the clock
    /// assumption).
    fn drop_and_create(&mut self) {
        let past_every_fence = self.highest_told as f64 / 1e6 + 1.0 - now_s();
        if past_every_fence > self.offset {
            self.offset = past_every_fence;
            let (offset, clock) = (self.offset, self.clock);
            let (_, client) = self.any_backend();
            clock.step_to(client, offset);
        }
        let (index, client) = self.any_backend();
        if let Err(err) = client.batch_execute("DROP EXTENSION pg_fence CASCADE; CREATE EXTENSION pg_fence") {
            self.unexpected("DROP and CREATE EXTENSION", err);
        }
        self.counts.drop_and_create += 1;
        self.note(format!("backend {index}: DROP and CREATE EXTENSION (clock {:+.3} s)", self.offset));
        self.held.clear();
        // The assumption holds for a key's first grant on the new history; later steps back of the
        // clock are then the fences' own to survive: each key is granted at once.
        for (key, _) in KEYS {
            let (index, client) = self.any_backend();
            match Acquire::new(key, "1 second").try_run(client) {
                Ok(Some(lease)) => {
                    let first = Held { key: key.into(), token: lease.token, fence: lease.fence };
                    self.granted(&format!("backend {index} first grant after CREATE EXTENSION"), first, true);
                }
                Ok(None) => self.fail(format!("{key} is held right after CREATE EXTENSION")),
                Err(err) => self.unexpected(&format!("backend {index}: acquire {key}"), err),
            }
        }
    }
}

fn now_s() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}
