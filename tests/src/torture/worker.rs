//! One client of the torture run. It loops: acquire a random key in the way the workload uses it
//! (see `KeyUse`), or a lease set of exclusive keys (waiting half of the time), write under each
//! fence one to three times (sometimes renewing in between), then release, or let the lease run
//! out. It records what it was told succeeded (acknowledged), treats a call whose outcome it cannot
//! know (connection lost, error at COMMIT) as unknown, and reconnects, retrying, whenever its
//! connection is lost. It takes the faults the chaos thread leaves for it.
use super::checker::{AckedGrant, AckedRelease, AckedRenewal, AckedWrite, Acknowledged};
use super::{client_name, key_name, Counts, Fault, KeyUse, Mode, Shared, SHARED_OR_EXCLUSIVE_WRITERS};
use crate::sqlstate;
use postgres::Client;
use rand::rngs::ThreadRng;
use rand::seq::SliceRandom;
use rand::Rng;
use std::mem::ManuallyDrop;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{FromRawFd, RawFd};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Times are fetched as microseconds since the epoch, to compare exactly with the history.
const ACQUIRE: &str = "
    SELECT (l).key, (l).fence, (l).token, (extract(epoch FROM (l).acquired_at) * 1000000)::bigint
      FROM fence.lease_acquire($1, $2::text::interval, wait => $3::text::interval, durable => $4,
                               shared => $5, permits => $6) l";
/// No row when the set was refused.
const ACQUIRE_ALL: &str = "
    SELECT key, fence, token, (extract(epoch FROM acquired_at) * 1000000)::bigint
      FROM fence.lease_acquire_all($1, $2::text::interval, wait => $3::text::interval, durable => $4)";
const RENEW: &str =
    "SELECT (extract(epoch FROM fence.lease_renew($1, $2, $3::text::interval)) * 1000000)::bigint";
const RENEW_ALL: &str =
    "SELECT (extract(epoch FROM fence.lease_renew_all($1, $2, $3::text::interval)) * 1000000)::bigint";
const RELEASE: &str = "SELECT fence.lease_release($1, $2)::int";
const RELEASE_ALL: &str = "SELECT fence.lease_release_all($1, $2)";
/// The key's row of the audit table gets the fence and the id of this write.
const WRITE: &str = "
    SELECT fence.fenced_update($1, $2, 'public.torture_resource',
                               jsonb_build_object('last_fence', $2::bigint, 'write_id', $3::bigint),
                               jsonb_build_object('key', $1::text))";

/// The wait of an acquire that waits: longer than most TTLs.
const WAIT: &str = "200 milliseconds";

/// How a call ended when it did not succeed.
enum Stop {
    /// pg_fence said no: lease lost (PF001) or stale fence (PF002). The connection is fine.
    Refused,
    /// The outcome is unknown; the connection is given up.
    Unknown,
}

type Outcome<T> = Result<T, Stop>;

/// What one acquire granted: a lease, or a lease set's leases, which share one token.
struct Lease {
    /// (key, fence) of each lease: one, or a set's, in key order.
    fences: Vec<(String, i64)>,
    token: Uuid,
    mode: Mode,
    /// The TTL of the last grant or renewal.
    ttl_ms: u64,
}

impl Lease {
    fn keys(&self) -> Vec<String> {
        self.fences.iter().map(|(key, _)| key.clone()).collect()
    }
}

/// What an acquire asks for.
struct Ask {
    keys: Vec<String>,
    shared: bool,
    permits: i32,
    set: bool,
}

impl Ask {
    fn mode(&self) -> Mode {
        match (self.set, self.shared, self.permits) {
            (true, _, _) => Mode::InSet,
            (_, true, _) => Mode::Shared,
            (_, _, 1) => Mode::Exclusive,
            _ => Mode::Permits,
        }
    }
}

struct Connection {
    client: Client,
    /// (this end's port, the server's port) of a TCP connection, to cut it.
    ports: Option<(u16, u16)>,
}

/// What a client hands back at the end of the run.
#[derive(Default)]
pub(super) struct WorkerLog {
    pub counts: Counts,
    pub acked: Acknowledged,
    pub unexpected: Vec<String>,
}

pub(super) struct Worker<'s> {
    id: usize,
    shared: &'s Shared<'s>,
    connection: Option<Connection>,
    ever_connected: bool,
    rng: ThreadRng,
    writes_made: i64,
    log: WorkerLog,
    /// With `Workload::call_timeout`: when the call in flight started, and the connection to cut.
    watchdog: Option<Watchdog>,
}

impl<'s> Worker<'s> {
    pub fn new(id: usize, shared: &'s Shared<'s>) -> Self {
        Worker {
            id,
            shared,
            connection: None,
            ever_connected: false,
            rng: rand::thread_rng(),
            writes_made: 0,
            log: WorkerLog::default(),
            watchdog: None,
        }
    }

    pub fn run(mut self) -> WorkerLog {
        if let Some(timeout) = self.shared.workload.call_timeout {
            self.watchdog = Some(start_watchdog(timeout));
        }
        while self.connected() {
            self.lease_cycle();
        }
        self.log
    }

    /// Acquire, work, release. Returns early when the key is held or the connection is lost.
    fn lease_cycle(&mut self) {
        let mut lease = match self.acquire() {
            Ok(Some(lease)) => lease,
            Ok(None) => return self.think(),
            Err(_) => return,
        };
        let told_lost = match self.work_under(&mut lease) {
            Ok(()) => false,
            Err(Stop::Refused) => true,
            Err(Stop::Unknown) => return,
        };
        // Sometimes let the lease run out instead. A client told its lease is lost releases it
        // anyway: that release must return false and touch no one (invariant 4).
        if told_lost || self.rng.gen_bool(0.85) {
            self.release(&lease, told_lost);
        }
    }

    /// Writes, and sometimes renews, until refused or done. With `resume_after_reconnect`, a lost
    /// connection is opened again and the work goes on under the same lease (possibly on another
    /// server, after a failover, where pg_fence must refuse it if the lease did not survive).
    fn work_under(&mut self, lease: &mut Lease) -> Outcome<()> {
        for _ in 0..self.rng.gen_range(1..=3) {
            let mut step = self.write_each(lease);
            if step.is_ok() && self.rng.gen_bool(0.3) {
                step = self.renew(lease);
            }
            match step {
                Err(Stop::Unknown) if self.shared.workload.resume_after_reconnect && self.connected() => {}
                Err(stop) => return Err(stop),
                Ok(()) => {}
            }
            self.think();
        }
        Ok(())
    }

    fn acquire(&mut self) -> Outcome<Option<Lease>> {
        let ask = self.ask();
        let ttl_ms = self.ttl_ms();
        let ttl = format!("{ttl_ms} milliseconds");
        let wait = if self.rng.gen_bool(0.5) { WAIT } else { "0" };
        let durable = !self.rng.gen_bool(self.shared.workload.fast_share);
        self.arm_kill();
        let result = if ask.set {
            self.client().query(ACQUIRE_ALL, &[&ask.keys, &ttl, &wait, &durable])
        } else {
            self.client().query(ACQUIRE, &[&ask.keys[0], &ttl, &wait, &durable, &ask.shared, &ask.permits])
        };
        let rows = self.settle(result, "")?;
        // A refused acquire returns a row of NULLs, a refused set no row.
        let granted: Vec<(String, i64, Uuid, i64)> = rows
            .iter()
            .filter_map(|row| Some((row.get::<_, Option<String>>(0)?, row.get(1), row.get(2), row.get(3))))
            .collect();
        let Some(&(_, _, token, _)) = granted.first() else {
            self.log.counts.refused_acquires += 1;
            return Ok(None);
        };
        let mode = ask.mode();
        self.log.counts.grants += granted.len() as u64;
        self.log.counts.grants_by_mode.bump(mode, granted.len() as u64);
        self.log.counts.sets += u64::from(ask.set);
        self.log.counts.fast_grants += if durable { 0 } else { granted.len() as u64 };
        let fences = granted.iter().map(|(key, fence, _, _)| (key.clone(), *fence)).collect();
        for (key, fence, _, acquired_us) in granted {
            let (shared, permits) = (ask.shared, ask.permits);
            self.log.acked.grants.push(AckedGrant { key, fence, acquired_us, durable, shared, permits });
        }
        Ok(Some(Lease { fences, token, mode, ttl_ms }))
    }

    /// What to acquire next: a lease set of exclusive keys `set_share` of the time, else a key at
    /// random, in the way the workload uses it.
    fn ask(&mut self) -> Ask {
        let keys = &self.shared.workload.keys;
        if self.rng.gen_bool(self.shared.workload.set_share) {
            let exclusive: Vec<usize> = (0..keys.len()).filter(|&k| keys[k] == KeyUse::Exclusive).collect();
            let size = self.rng.gen_range(2..=3).min(exclusive.len());
            let chosen = exclusive.choose_multiple(&mut self.rng, size).map(|&k| key_name(k)).collect();
            return Ask { keys: chosen, shared: false, permits: 1, set: true };
        }
        let index = self.rng.gen_range(0..keys.len());
        let (shared, permits) = match keys[index] {
            KeyUse::Exclusive => (false, 1),
            KeyUse::SharedOrExclusive => (!self.rng.gen_bool(SHARED_OR_EXCLUSIVE_WRITERS), 1),
            KeyUse::Permits(permits) => (false, permits),
            KeyUse::DisagreeingPermits(one, other) => {
                (false, if self.rng.gen_bool(0.5) { one } else { other })
            }
        };
        Ask { keys: vec![key_name(index)], shared, permits, set: false }
    }

    /// A write under each lease of what was granted (one, or a set's).
    fn write_each(&mut self, lease: &Lease) -> Outcome<()> {
        for (key, fence) in &lease.fences {
            self.write(key, *fence, lease)?;
        }
        Ok(())
    }

    /// A fenced write, in autocommit or in an explicit transaction, with a pause past the TTL
    /// before it or inside its transaction when the chaos thread asked for one.
    fn write(&mut self, key: &str, fence: i64, lease: &Lease) -> Outcome<()> {
        self.writes_made += 1;
        // Unique, and readable: 3000000017 is client 3's 17th write.
        let write_id = self.id as i64 * 1_000_000_000 + self.writes_made;
        let pause = self.take_pause(lease);
        let result = if self.rng.gen_bool(0.3) {
            self.write_in_transaction(key, fence, write_id, pause)
        } else {
            if let Some(pause) = pause {
                thread::sleep(pause);
            }
            self.arm_kill();
            let result = self.client().query_one(WRITE, &[&key, &fence, &write_id]);
            self.settle(result, "PF002").map(|_| ())
        };
        match result {
            Ok(()) => {
                self.log.counts.accepted_writes += 1;
                self.log.counts.writes_by_mode.bump(lease.mode, 1);
                self.log.acked.writes.push(AckedWrite { key: key.to_string(), fence, write_id });
            }
            Err(Stop::Refused) => self.log.counts.stale_writes += 1,
            Err(Stop::Unknown) => {}
        }
        result
    }

    /// BEGIN; fenced_update; [pause]; COMMIT. A pause here outlasts the lease after the write
    /// passed its fence check: the commit must still come before the next holder's grant
    /// (invariant 3). An error at COMMIT leaves the outcome unknown.
    fn write_in_transaction(
        &mut self,
        key: &str,
        fence: i64,
        write_id: i64,
        pause: Option<Duration>,
    ) -> Outcome<()> {
        self.arm_kill();
        let attempt = (|| {
            let mut transaction = self.client().transaction().map_err(Failed::Before)?;
            transaction.query_one(WRITE, &[&key, &fence, &write_id]).map_err(Failed::Before)?;
            if let Some(pause) = pause {
                thread::sleep(pause);
            }
            transaction.commit().map_err(|_| Failed::AtCommit)
        })();
        match attempt {
            Ok(()) => {
                self.disarm_watchdog();
                Ok(())
            }
            Err(Failed::Before(err)) => self.settle(Err(err), "PF002"),
            Err(Failed::AtCommit) => Err(self.give_up_connection()),
        }
    }

    /// Renews, after a pause past the TTL when the chaos thread asked for one (lease lost, PF001).
    /// A set is renewed whole or not at all.
    fn renew(&mut self, lease: &mut Lease) -> Outcome<()> {
        if let Some(pause) = self.take_pause(lease) {
            thread::sleep(pause);
        }
        let ttl_ms = self.ttl_ms();
        let ttl = format!("{ttl_ms} milliseconds");
        self.arm_kill();
        let set = lease.mode == Mode::InSet;
        let result = if set {
            self.client().query_one(RENEW_ALL, &[&lease.keys(), &lease.token, &ttl])
        } else {
            self.client().query_one(RENEW, &[&lease.fences[0].0, &lease.token, &ttl])
        };
        match self.settle(result, "PF001") {
            Ok(row) => {
                self.log.counts.renewals += 1;
                let expires_us = row.get(0);
                for (key, fence) in &lease.fences {
                    let (key, fence, at_least) = (key.clone(), *fence, set);
                    self.log.acked.renewals.push(AckedRenewal { key, fence, expires_us, at_least });
                }
                lease.ttl_ms = ttl_ms;
                Ok(())
            }
            Err(Stop::Refused) => {
                self.log.counts.lost_renewals += 1;
                Err(Stop::Refused)
            }
            Err(stop) => Err(stop),
        }
    }

    /// A lease told lost (PF001, PF002) is no longer held, so a set with it in cannot be released
    /// whole any more: a release that ends as many leases as were granted is a violation then.
    fn release(&mut self, lease: &Lease, told_lost: bool) {
        self.arm_kill();
        let result = if lease.mode == Mode::InSet {
            self.client().query_one(RELEASE_ALL, &[&lease.keys(), &lease.token])
        } else {
            self.client().query_one(RELEASE, &[&lease.fences[0].0, &lease.token])
        };
        let Ok(row) = self.settle(result, "") else { return };
        let ended = row.get::<_, i32>(0) as usize;
        if ended < lease.fences.len() {
            // Which of a set's leases ended is not told: a partial release acknowledges none.
            self.log.counts.stale_releases += 1;
            return;
        }
        self.log.counts.releases += 1;
        for (key, fence) in &lease.fences {
            self.log.acked.releases.push(AckedRelease { key: key.clone(), fence: *fence });
        }
        if told_lost {
            let (key, fence) = &lease.fences[0];
            let detail = format!(
                "{key}: release of fence {fence} by {} returned true after the lease was reported lost",
                client_name(self.id)
            );
            self.log.acked.stale_releases_accepted.push(detail);
        }
    }

    /// Sorts a failed call: `refusal` (a SQLSTATE, or "" for none) is pg_fence saying no; the
    /// connection dying is an unknown outcome; anything else is unexpected, and unknown too.
    fn settle<T>(&mut self, result: Result<T, postgres::Error>, refusal: &str) -> Outcome<T> {
        self.disarm_watchdog();
        let err = match result {
            Ok(value) => return Ok(value),
            Err(err) => err,
        };
        let code = sqlstate(&err);
        if !refusal.is_empty() && code == refusal {
            return Err(Stop::Refused);
        }
        if !connection_lost(&code) {
            self.log.counts.unexpected_errors += 1;
            self.log.unexpected.push(format!("{}: {err} ({code})", client_name(self.id)));
        }
        Err(self.give_up_connection())
    }

    fn give_up_connection(&mut self) -> Stop {
        self.disarm_watchdog();
        self.connection = None;
        self.log.counts.unknown += 1;
        Stop::Unknown
    }

    /// Makes sure there is a connection, retrying until the run is over; false once it is over.
    fn connected(&mut self) -> bool {
        while !self.shared.over() {
            if self.connection.is_some() {
                return true;
            }
            match self.open() {
                Ok(connection) => {
                    self.log.counts.reconnects += u64::from(self.ever_connected);
                    self.ever_connected = true;
                    self.connection = Some(connection);
                }
                // The server may be restarting, or refusing connections during recovery.
                Err(_) => thread::sleep(Duration::from_millis(25)),
            }
        }
        false
    }

    fn open(&self) -> Result<Connection, postgres::Error> {
        let mut client = (self.shared.connect)()?;
        // The name lets the chaos thread find this client's backend; the timeout bounds a hang.
        let name = client_name(self.id);
        client.batch_execute(&format!("SET application_name = '{name}'; SET statement_timeout = '30s'"))?;
        let row = client.query_one("SELECT inet_client_port(), inet_server_port()", &[])?;
        let ports = match (row.get::<_, Option<i32>>(0), row.get::<_, Option<i32>>(1)) {
            (Some(ours), Some(theirs)) => Some((ours as u16, theirs as u16)),
            _ => None, // a Unix socket: it cannot be cut, KillClient passes it by
        };
        Ok(Connection { client, ports })
    }

    fn client(&mut self) -> &mut Client {
        &mut self.connection.as_mut().expect("a call after the connection was given up").client
    }

    /// When the chaos thread asked for it, cuts this client's connection a random moment (under
    /// 1.5 ms) after the next statement is sent: while it runs, between a transaction's statements,
    /// or at its COMMIT.
    fn arm_kill(&mut self) {
        let Some(ports) = self.connection.as_ref().and_then(|connection| connection.ports) else { return };
        if let Some(watchdog) = &self.watchdog {
            *watchdog.lock().unwrap() = Some((Instant::now(), ports));
        }
        if !self.shared.take_fault(self.id, Fault::KillClient) {
            return;
        }
        self.log.counts.kills += 1;
        let delay = Duration::from_micros(self.rng.gen_range(0..1_500));
        thread::spawn(move || {
            thread::sleep(delay);
            sever(ports);
        });
    }

    /// The call in flight is over (its outcome is in).
    fn disarm_watchdog(&mut self) {
        if let Some(watchdog) = &self.watchdog {
            *watchdog.lock().unwrap() = None;
        }
    }

    /// A pause the chaos thread asked for: past the lease's TTL, counted from now, so certainly
    /// past its expiry.
    fn take_pause(&mut self, lease: &Lease) -> Option<Duration> {
        if !self.shared.take_fault(self.id, Fault::Pause) {
            return None;
        }
        self.log.counts.pauses += 1;
        Some(Duration::from_millis(lease.ttl_ms + self.rng.gen_range(10..100)))
    }

    fn ttl_ms(&mut self) -> u64 {
        self.rng.gen_range(self.shared.workload.ttl_ms.clone())
    }

    /// A moment between calls, as real clients have.
    fn think(&mut self) {
        thread::sleep(Duration::from_micros(self.rng.gen_range(0..5_000)));
    }
}

/// When the call in flight started, and the (client port, server port) of its connection.
type Watchdog = Arc<Mutex<Option<(Instant, (u16, u16))>>>;

/// A thread that cuts the worker's connection when a call (armed by `arm_kill`, disarmed when its
/// outcome is in) runs past `timeout`; it ends when the worker drops its end.
fn start_watchdog(timeout: Duration) -> Watchdog {
    let watchdog: Watchdog = Arc::new(Mutex::new(None));
    let watched = Arc::clone(&watchdog);
    thread::spawn(move || {
        while Arc::strong_count(&watched) > 1 {
            thread::sleep(Duration::from_millis(50));
            let mut armed = watched.lock().unwrap();
            if let Some((since, ports)) = *armed {
                if since.elapsed() > timeout {
                    sever(ports);
                    *armed = None;
                }
            }
        }
    });
    watchdog
}

/// Where an explicit transaction failed.
enum Failed {
    Before(postgres::Error),
    AtCommit,
}

/// The errors that mean the connection (or the server) went away: no SQLSTATE at all (I/O error,
/// closed connection), class 08 (connection exception) and 57P0x (admin shutdown, crash shutdown,
/// cannot connect now).
fn connection_lost(code: &str) -> bool {
    code.is_empty() || code.starts_with("08") || code.starts_with("57P")
}

/// Shuts down, in both directions, this process's TCP connection from local port `ours` to port
/// `theirs`, found among its open file descriptors. An abrupt end, as when a client process is
/// killed: the client library gets no chance to say goodbye, the server sees the socket close
/// wherever it is (mid-statement, mid-transaction, at COMMIT), and the client's pending call fails.
fn sever((ours, theirs): (u16, u16)) {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else { return };
    let port = |address: std::io::Result<SocketAddr>| address.ok().map(|address| address.port());
    for entry in entries.flatten() {
        let Some(fd) = entry.file_name().to_str().and_then(|name| name.parse::<RawFd>().ok()) else {
            continue;
        };
        let link = std::fs::read_link(entry.path()).unwrap_or_default();
        if !link.to_string_lossy().starts_with("socket:") {
            continue;
        }
        // SAFETY: the descriptor is only borrowed: ManuallyDrop never closes it. If another thread
        // closed it meanwhile, the address lookups below fail and it is skipped.
        let socket = ManuallyDrop::new(unsafe { TcpStream::from_raw_fd(fd) });
        if port(socket.local_addr()) == Some(ours) && port(socket.peer_addr()) == Some(theirs) {
            let _ = socket.shutdown(Shutdown::Both);
            return;
        }
    }
}
