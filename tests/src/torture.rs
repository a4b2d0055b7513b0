//! A torture run for pg_fence, and the checker of its history.
//!
//! N client threads take leases on K keys (with and without `wait`), write under their fences with
//! `fenced_update`, renew and release, with TTLs short enough that leases expire and change hands
//! all the time. Each key is used in one way (`KeyUse`): exclusive leases, single and in lease
//! sets; shared leases beside exclusive ones; a semaphore's permits, on one key by callers that
//! disagree about its count. Meanwhile a chaos thread throws faults at random: a client pauses
//! past its TTL while holding a lease, a client's connection is cut in the middle of a call, a
//! client's backend is terminated, the whole server is killed (kill -9) and restarted.
//!
//! What happened is recorded by the server itself, not by the clients: triggers append every new
//! version of a lease row and every accepted write to history tables, in the transaction that makes
//! the change, so a history row commits, or vanishes in a crash, together with its change. Commit
//! timestamps (`track_commit_timestamp = on`) order the changes of both tables. The clients only add
//! what they were told (acknowledged), so that the checker can tell whether any of it was lost.
//! See `checker` for what is checked.
//!
//! Reusable by other tests: the caller says how to connect (a failover test can point clients at a
//! promoted standby), what a server fault is (kill -9 and restart, or a failover), and which faults
//! to throw.
mod chaos;
mod checker;
mod recording;
mod worker;

pub use checker::{
    check, check_with, AckedGrant, AckedRelease, AckedRenewal, AckedWrite, Acknowledged, AtOnce, Checked,
    Lost, Violation, Violations,
};
pub use recording::{install, load_history, History, LeaseChange, LeaseChangeKind, RecordedWrite};

use postgres::Client;
use std::fmt;
use std::ops::Range;
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

/// How clients (and the checker) connect: called again after every lost connection, so it may
/// return a connection to another server than last time (after a failover).
pub type Connect<'a> = dyn Fn() -> Result<Client, postgres::Error> + Sync + 'a;

/// A fault of the whole server, run by the chaos thread: typically kill -9 and restart. It must
/// return once the server (or its replacement) accepts connections again.
pub type ServerFault<'a> = dyn Fn() + Sync + 'a;

/// The faults the chaos thread can throw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// A client holding a lease stops for longer than its TTL (as under SIGSTOP or a long GC),
    /// before its write or in the middle of its write's transaction, then carries on.
    Pause,
    /// A client's connection is cut while a call is in flight (shutdown of its socket): the
    /// server sees the client vanish mid-statement or mid-transaction.
    KillClient,
    /// pg_terminate_backend of a random client's backend.
    TerminateBackend,
    /// The caller's `ServerFault`.
    ServerCrash,
}

/// How the clients use a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyUse {
    /// Exclusive leases, alone or in lease sets (`lease_acquire_all`) with other such keys.
    Exclusive,
    /// Shared leases (readers) and, `SHARED_OR_EXCLUSIVE_WRITERS` of the time, exclusive ones.
    SharedOrExclusive,
    /// A semaphore: every caller asks for these many permits.
    Permits(i32),
    /// A semaphore whose callers disagree about its count: each asks for one of the two.
    DisagreeingPermits(i32, i32),
}

/// The share of the acquires of a `KeyUse::SharedOrExclusive` key that ask for an exclusive lease.
const SHARED_OR_EXCLUSIVE_WRITERS: f64 = 0.25;

/// What the torture run does.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Client threads, each with its own connection (application_name `torture-client-N`).
    pub clients: usize,
    /// Keys `key-0` .. `key-(K-1)`, used as listed, each with one row in the audit table
    /// `torture_resource`.
    pub keys: Vec<KeyUse>,
    /// The share of lease cycles that take a lease set of 2 or 3 `KeyUse::Exclusive` keys (there
    /// must be two at least); the others take one key, any of them at random.
    pub set_share: f64,
    /// How long the clients run.
    pub duration: Duration,
    /// TTLs of grants and renewals, in milliseconds.
    pub ttl_ms: Range<u64>,
    /// The share of grants that are fast leases (`durable => false`), on the same keys as the
    /// durable ones.
    pub fast_share: f64,
    /// The faults the chaos thread throws.
    pub faults: Vec<Fault>,
    /// Mean time between two client faults (pause, kill, terminate: one of those selected).
    pub client_fault_every: Duration,
    /// Mean time between two server faults.
    pub server_fault_every: Duration,
    /// A call that takes longer is cut (its socket shut down), as a client's own timeout would:
    /// a frozen (SIGSTOPped) server would otherwise hold its clients until it resumes. None: never.
    pub call_timeout: Option<Duration>,
    /// A client whose connection was lost while it held a lease reconnects and carries on under
    /// that lease (writes with its fence, renews with its token), as a real client does after a
    /// failover; else it gives the lease up.
    pub resume_after_reconnect: bool,
    /// Acknowledged grants, renewals and writes may be missing from the history (a failover to an
    /// asynchronous standby): they are counted in `Counts::lost`, not violations.
    pub history_may_be_lost: bool,
}

impl Default for Workload {
    /// The CI run: 8 clients for 90 s on 6 keys (3 exclusive, taken in sets too, 1 shared or
    /// exclusive, a semaphore of 3 and one of 2 or 3), 30 % of the grants fast, every fault, a
    /// server crash about every 30 s.
    fn default() -> Workload {
        Workload {
            clients: 8,
            keys: vec![
                KeyUse::Exclusive,
                KeyUse::Exclusive,
                KeyUse::Exclusive,
                KeyUse::SharedOrExclusive,
                KeyUse::Permits(3),
                KeyUse::DisagreeingPermits(2, 3),
            ],
            set_share: 0.15,
            duration: Duration::from_secs(90),
            ttl_ms: 20..300,
            fast_share: 0.3,
            faults: vec![Fault::Pause, Fault::KillClient, Fault::TerminateBackend, Fault::ServerCrash],
            client_fault_every: Duration::from_millis(250),
            server_fault_every: Duration::from_secs(30),
            call_timeout: None,
            resume_after_reconnect: false,
            history_may_be_lost: false,
        }
    }
}

/// A count per mode of lease: exclusive leases taken alone, shared leases, semaphore permits, and
/// the leases of lease sets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PerMode {
    pub exclusive: u64,
    pub shared: u64,
    pub permits: u64,
    pub in_sets: u64,
}

/// A lease's mode, for `PerMode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Exclusive,
    Shared,
    Permits,
    InSet,
}

impl PerMode {
    fn bump(&mut self, mode: Mode, by: u64) {
        *match mode {
            Mode::Exclusive => &mut self.exclusive,
            Mode::Shared => &mut self.shared,
            Mode::Permits => &mut self.permits,
            Mode::InSet => &mut self.in_sets,
        } += by;
    }

    fn add(&mut self, other: &PerMode) {
        self.exclusive += other.exclusive;
        self.shared += other.shared;
        self.permits += other.permits;
        self.in_sets += other.in_sets;
    }
}

impl fmt::Display for PerMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let PerMode { exclusive, shared, permits, in_sets } = self;
        write!(f, "exclusive {exclusive}, shared {shared}, permits {permits}, in sets {in_sets}")
    }
}

/// What the run did. Acknowledged means the client saw the call succeed (and, for a write in an
/// explicit transaction, its COMMIT return).
#[derive(Clone, Debug, Default)]
pub struct Counts {
    /// Acknowledged grants (a lease set's count one per key).
    pub grants: u64,
    /// The same by mode.
    pub grants_by_mode: PerMode,
    /// Acknowledged lease sets (lease_acquire_all calls that granted).
    pub sets: u64,
    /// Of the grants, fast leases (`durable => false`).
    pub fast_grants: u64,
    /// Acquires that returned NULL (the key was held, or the wait ran out).
    pub refused_acquires: u64,
    /// Acknowledged renewals.
    pub renewals: u64,
    /// Renewals refused with lease lost (PF001).
    pub lost_renewals: u64,
    /// Acknowledged fenced writes.
    pub accepted_writes: u64,
    /// The same by the mode of the lease they were made under.
    pub writes_by_mode: PerMode,
    /// Fenced writes refused as stale (PF002).
    pub stale_writes: u64,
    /// Releases that returned true.
    pub releases: u64,
    /// Releases that returned false (the lease had expired or was taken over).
    pub stale_releases: u64,
    /// Acknowledged releases whose lease row change the server no longer has: lost in a crash
    /// before being flushed, as documented (the lease then ran out its TTL). Not a violation.
    pub releases_lost_in_crashes: u64,
    /// Acknowledged fast grants whose record a crash took with the lease (allowed).
    pub fast_grants_lost_in_crashes: u64,
    /// Calls whose outcome the client cannot know: the connection died, or COMMIT failed.
    pub unknown: u64,
    /// New connections after a lost one.
    pub reconnects: u64,
    /// Faults as they hit: pauses taken, connections cut, backends terminated, server faults.
    pub pauses: u64,
    pub kills: u64,
    pub terminations: u64,
    pub crashes: u64,
    /// Errors that none of the above explains (listed in `Report::unexpected_errors`).
    pub unexpected_errors: u64,
    /// Acknowledged durable changes missing from the history (violations unless
    /// `Workload::history_may_be_lost`).
    pub lost: Lost,
    /// The most leases of one key live at once, by the history.
    pub most_at_once: AtOnce,
}

impl Counts {
    fn add(&mut self, other: &Counts) {
        self.grants += other.grants;
        self.grants_by_mode.add(&other.grants_by_mode);
        self.sets += other.sets;
        self.fast_grants += other.fast_grants;
        self.refused_acquires += other.refused_acquires;
        self.renewals += other.renewals;
        self.lost_renewals += other.lost_renewals;
        self.accepted_writes += other.accepted_writes;
        self.writes_by_mode.add(&other.writes_by_mode);
        self.stale_writes += other.stale_writes;
        self.releases += other.releases;
        self.stale_releases += other.stale_releases;
        self.releases_lost_in_crashes += other.releases_lost_in_crashes;
        self.unknown += other.unknown;
        self.reconnects += other.reconnects;
        self.pauses += other.pauses;
        self.kills += other.kills;
        self.terminations += other.terminations;
        self.crashes += other.crashes;
        self.unexpected_errors += other.unexpected_errors;
    }
}

/// The outcome of a torture run.
#[derive(Debug)]
pub struct Report {
    pub counts: Counts,
    pub violations: Violations,
    /// The first few unexpected errors, as the clients saw them.
    pub unexpected_errors: Vec<String>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.counts;
        writeln!(f, "torture run:")?;
        writeln!(
            f,
            "  grants {} ({} fast), refused acquires {}",
            c.grants, c.fast_grants, c.refused_acquires
        )?;
        writeln!(f, "  grants by mode: {}; lease sets {}", c.grants_by_mode, c.sets)?;
        writeln!(
            f,
            "  most live at once on a key: shared leases {}, semaphore permits {}",
            c.most_at_once.shared, c.most_at_once.permits
        )?;
        writeln!(f, "  renewals {}, renewals refused as lease lost (PF001) {}", c.renewals, c.lost_renewals)?;
        writeln!(
            f,
            "  accepted writes {}, rejected stale writes (PF002) {}",
            c.accepted_writes, c.stale_writes
        )?;
        writeln!(f, "  accepted writes by mode: {}", c.writes_by_mode)?;
        writeln!(f, "  releases {}, stale releases (false) {}", c.releases, c.stale_releases)?;
        writeln!(f, "  acknowledged releases lost in crashes (allowed) {}", c.releases_lost_in_crashes)?;
        writeln!(
            f,
            "  acknowledged fast grants lost in crashes (allowed) {}",
            c.fast_grants_lost_in_crashes
        )?;
        writeln!(f, "  unknown outcomes {}, reconnects {}", c.unknown, c.reconnects)?;
        writeln!(
            f,
            "  faults: pauses {}, connections cut {}, backends terminated {}, restarts (crashes) {}",
            c.pauses, c.kills, c.terminations, c.crashes
        )?;
        if c.lost != Lost::default() {
            let Lost { grants, renewals, writes } = c.lost;
            writeln!(
                f,
                "  acknowledged durable changes missing from the history: grants {grants}, renewals {renewals}, writes {writes}"
            )?;
        }
        writeln!(f, "  unexpected errors {}", c.unexpected_errors)?;
        for error in &self.unexpected_errors {
            writeln!(f, "    {error}")?;
        }
        write!(f, "{}", self.violations)
    }
}

/// What the threads of a run share.
struct Shared<'a> {
    workload: &'a Workload,
    connect: &'a Connect<'a>,
    deadline: Instant,
    /// A fault waiting for each client to take it (Pause or KillClient), set by the chaos thread.
    mailboxes: Vec<Mutex<Option<Fault>>>,
}

impl Shared<'_> {
    fn over(&self) -> bool {
        Instant::now() >= self.deadline
    }

    /// Takes the fault waiting for `client` if it is `fault`.
    fn take_fault(&self, client: usize, fault: Fault) -> bool {
        let mut mailbox = self.mailboxes[client].lock().unwrap();
        let waiting = *mailbox == Some(fault);
        if waiting {
            *mailbox = None;
        }
        waiting
    }
}

pub fn key_name(index: usize) -> String {
    format!("key-{index}")
}

/// The application_name of client `id`, by which the chaos thread finds its backend.
fn client_name(id: usize) -> String {
    format!("torture-client-{id}")
}

/// Runs the workload, then checks the history; prints and returns the report. `server_fault` is
/// needed when `workload.faults` contains ServerCrash. The database must allow the objects that
/// `recording::install` creates (connect as a superuser) and have `track_commit_timestamp = on`.
pub fn run(workload: &Workload, connect: &Connect<'_>, server_fault: Option<&ServerFault<'_>>) -> Report {
    assert!(
        server_fault.is_some() || !workload.faults.contains(&Fault::ServerCrash),
        "Fault::ServerCrash needs a server_fault"
    );
    let exclusive_keys = workload.keys.iter().filter(|used| **used == KeyUse::Exclusive).count();
    assert!(workload.set_share == 0.0 || exclusive_keys >= 2, "lease sets need two exclusive keys");
    let keys: Vec<String> = (0..workload.keys.len()).map(key_name).collect();
    install(&mut connect_patiently(connect), &keys).expect("install the recording triggers");

    let shared = Shared {
        workload,
        connect,
        deadline: Instant::now() + workload.duration,
        mailboxes: (0..workload.clients).map(|_| Mutex::new(None)).collect(),
    };
    let (mut counts, acked, mut unexpected_errors) = drive(&shared, server_fault);

    let mut client = connect_patiently(connect);
    wait_for_clients_to_leave(&mut client);
    let history = load_history(&mut client).expect("read the recorded history");
    counts.releases_lost_in_crashes = checker::releases_missing(&history, &acked);
    counts.fast_grants_lost_in_crashes = checker::fast_grants_missing(&history, &acked);
    let Checked { violations, lost, most_at_once } =
        checker::check_with(&history, &acked, workload.history_may_be_lost);
    counts.lost = lost;
    counts.most_at_once = most_at_once;
    unexpected_errors.truncate(10);
    let report = Report { counts, violations, unexpected_errors };
    println!("{report}");
    report
}

/// The clients and the chaos thread, until the deadline. Returns the merged counts, everything
/// the clients saw acknowledged, and the unexpected errors.
fn drive(shared: &Shared, server_fault: Option<&ServerFault<'_>>) -> (Counts, Acknowledged, Vec<String>) {
    thread::scope(|scope| {
        let workers: Vec<_> = (0..shared.workload.clients)
            .map(|id| scope.spawn(move || worker::Worker::new(id, shared).run()))
            .collect();
        let chaos = scope.spawn(move || chaos::run(shared, server_fault));

        let mut counts = chaos.join().unwrap();
        let mut acked = Acknowledged::default();
        let mut unexpected = Vec::new();
        for worker in workers {
            let log = worker.join().unwrap();
            counts.add(&log.counts);
            acked.extend(log.acked);
            unexpected.extend(log.unexpected);
        }
        (counts, acked, unexpected)
    })
}

/// Connects, retrying for up to a minute (the server may be restarting).
fn connect_patiently(connect: &Connect<'_>) -> Client {
    let start = Instant::now();
    loop {
        match connect() {
            Ok(client) => return client,
            Err(err) if start.elapsed() > Duration::from_secs(60) => panic!("cannot connect: {err}"),
            Err(_) => thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Clients whose connection was cut may still have a backend finishing its statement; the history
/// is read once they are gone (it is read in one snapshot anyway).
fn wait_for_clients_to_leave(client: &mut Client) {
    crate::eventually(Duration::from_secs(30), || {
        let left: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'torture-client-%'",
                &[],
            )
            .unwrap()
            .get(0);
        left == 0
    });
}
