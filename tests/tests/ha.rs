//! Failovers under load, with Patroni: the torture workload (src/torture.rs) runs against the HA
//! cluster of `pg_test/ha` through its multi-host connection string, reconnecting as real clients
//! do, while a fault thread makes Patroni fail over four ways in turn: kill -9 of the leader's
//! PostgreSQL, SIGSTOP of it past the leader key's ttl (then SIGCONT), SIGTERM of the leader's
//! Patroni (which stops its PostgreSQL; started again after), and a switchover. After each
//! failover it shows, per node, where pg_fence's sweeper worker runs and what it swept. Beside the
//! workload, a leader election runs through the same failovers (`election`).
//!
//! Run by `pg_test/run-ha`, which starts the cluster in each mode: these tests are #[ignore]d, as
//! they need that cluster. PG_FENCE_HA_SECONDS sets the workload's length (default 90).
//! - `failovers_with_synchronous_replication` (`pg_test/ha start --sync`: synchronous_mode and
//!   synchronous_mode_strict): no violation of the invariants, nothing acknowledged lost.
//! - `failovers_with_asynchronous_replication` (Patroni's default): acknowledged grants, renewals
//!   and writes may be lost with the old primary's last WAL (counted); still no fence granted twice
//!   or below an earlier one, and no write under a fence landing after a higher grant.
#[path = "ha/election.rs"]
mod election;

use pg_fence_integration::torture::{self, Fault, Report, Violation, Workload};
use postgres::{Client, NoTls};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

/// How long the old leader stays SIGSTOPped: past the ttl (10 s), so Patroni fails over meanwhile.
const PAUSE_SECONDS: u64 = 15;
/// libpq's connect_timeout, applied per host as libpq does.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

fn ha_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../pg_test/ha")
}

/// `pg_test/ha ARGS`: its standard output, or None when it failed (saying why).
fn ha(args: &[&str]) -> Option<String> {
    let out = Command::new(ha_script()).args(args).output().expect("run pg_test/ha");
    if !out.status.success() {
        eprintln!("pg_test/ha {args:?}: {}", String::from_utf8_lossy(&out.stderr).trim());
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The leader's name, None while there is none (polled: no complaint).
fn current_leader() -> Option<String> {
    let out = Command::new(ha_script()).arg("leader").output().expect("run pg_test/ha");
    let out = String::from_utf8_lossy(&out.stdout);
    out.split_whitespace().next().map(str::to_string)
}

fn ha_seconds() -> u64 {
    std::env::var("PG_FENCE_HA_SECONDS").map_or(90, |s| s.parse().expect("PG_FENCE_HA_SECONDS: seconds"))
}

/// The hosts of the multi-host string, and what the string says besides.
struct Dsn {
    hosts: Vec<(String, u16)>,
    rest: String,
}

impl Dsn {
    /// `host=a,b,c port=x,y,z other=...`, as `pg_test/ha dsn` prints it.
    fn parse(dsn: &str) -> Dsn {
        let (mut hosts, mut ports, mut rest) = (Vec::new(), Vec::new(), Vec::new());
        for word in dsn.split_whitespace() {
            match word.split_once('=') {
                Some(("host", list)) => hosts = list.split(',').map(str::to_string).collect(),
                Some(("port", list)) => ports = list.split(',').map(|p| p.parse().unwrap()).collect(),
                Some(("connect_timeout", _)) => {}
                _ => rest.push(word),
            }
        }
        assert_eq!(hosts.len(), ports.len(), "{dsn}");
        Dsn { hosts: hosts.into_iter().zip(ports).collect(), rest: rest.join(" ") }
    }

    /// Tries each host in turn, as libpq does with a multi-host string, and takes the first that
    /// accepts the connection under its options (target_session_attrs=read-write: the primary).
    /// Each attempt is bounded as a whole, as libpq's connect_timeout is: rust-postgres bounds only
    /// the TCP connect, and a SIGSTOPped server's kernel still accepts that, then never answers.
    fn connect(&self) -> Result<Client, String> {
        for (host, port) in &self.hosts {
            match connect_within(&format!("host={host} port={port} {}", self.rest), CONNECT_TIMEOUT) {
                Ok(client) => return Ok(client),
                Err(_) => continue,
            }
        }
        Err("no host accepted a read-write connection".into())
    }
}

/// A connection, or an error once `limit` has passed. A timed-out attempt is left to its thread,
/// which ends when the server answers or the connection fails (the client is then dropped).
fn connect_within(config: &str, limit: Duration) -> Result<Client, String> {
    let (send, receive) = mpsc::channel();
    let config = config.to_string();
    thread::spawn(move || {
        let _ = send.send(Client::connect(&config, NoTls).map_err(|err| err.to_string()));
    });
    receive.recv_timeout(limit).map_err(|_| "timed out".to_string())?
}

/// The nodes, by name, with their PostgreSQL ports (as `pg_test/ha` numbers them).
fn nodes(dsn: &Dsn) -> Vec<(String, u16)> {
    dsn.hosts.iter().enumerate().map(|(i, (_, port))| (format!("node{}", i + 1), *port)).collect()
}

/// The four failovers, in the order they are made.
#[derive(Clone, Copy, Debug)]
enum Kind {
    KillLeader,
    PauseLeader,
    StopPatroni,
    Switchover,
}

/// One failover made.
struct Failover {
    kind: Kind,
    from: String,
    to: String,
    /// From the fault to a new leader that accepts writes.
    seconds: f64,
}

/// Makes one failover of `kind`; returns once another node is a writable leader, and the old one
/// has been let go on (resumed, its Patroni started again).
fn fail_over(kind: Kind, dsn: &Dsn) -> Failover {
    ha(&["wait-healthy", "120"]).expect("the cluster is healthy before the failover");
    let from = current_leader().expect("a leader");
    let started = Instant::now();
    let mut paused: Option<Child> = None;
    match kind {
        Kind::KillLeader => drop(ha(&["kill-leader"]).expect("kill-leader")),
        Kind::PauseLeader => {
            let child = Command::new(ha_script()).args(["pause-leader", &PAUSE_SECONDS.to_string()]).spawn();
            paused = Some(child.expect("pause-leader"));
        }
        Kind::StopPatroni => drop(ha(&["stop-patroni-leader"]).expect("stop-patroni-leader")),
        Kind::Switchover => drop(ha(&["switchover"]).expect("switchover")),
    }
    let to = wait_for_new_leader(&from, dsn);
    let seconds = started.elapsed().as_secs_f64();
    if let Some(mut child) = paused {
        assert!(child.wait().unwrap().success(), "pause-leader");
    }
    if let Kind::StopPatroni = kind {
        ha(&["start-node", &from]).expect("start the old leader's Patroni again");
    }
    eprintln!("ha: {kind:?}: {from} -> {to} in {seconds:.1} s");
    Failover { kind, from, to, seconds }
}

/// Waits (up to 90 s) until a node other than `old` leads and its PostgreSQL takes writes.
fn wait_for_new_leader(old: &str, dsn: &Dsn) -> String {
    let deadline = Instant::now() + Duration::from_secs(90);
    while Instant::now() < deadline {
        if let Some(leader) = current_leader().filter(|leader| leader != old) {
            let port = nodes(dsn).into_iter().find(|(name, _)| *name == leader).unwrap().1;
            if let Ok(mut client) = connect_within(&node_config(port), CONNECT_TIMEOUT) {
                if client.query_one("SELECT NOT pg_is_in_recovery()", &[]).is_ok_and(|row| row.get(0)) {
                    return leader;
                }
            }
        }
        thread::sleep(Duration::from_millis(100));
    }
    panic!("no new leader 90 s after the failover from {old}");
}

fn node_config(port: u16) -> String {
    format!("host=127.0.0.1 port={port} user=postgres dbname=postgres application_name=pg_fence_ha")
}

/// Where the sweeper worker runs after a failover: on each node, whether it is in recovery, its
/// `pg_fence sweeper` backends, and `fence.sweeper` as that node has it (a standby has the
/// primary's figures, replicated). Waits (up to 15 s) for a sweep on the new leader after it took
/// over. Returns the lines to print, and whether the worker runs on the leader and nowhere else.
fn sweeper_evidence(leader: &str, dsn: &Dsn) -> (Vec<String>, bool) {
    let mut lines = Vec::new();
    let now = current_leader();
    if now.as_deref() != Some(leader) {
        // The node promoted lost the lead again (as with a leader key taken back: a split brain).
        lines.push(format!("the leader is now {now:?}, not {leader}"));
        return (lines, false);
    }
    let port = nodes(dsn).into_iter().find(|(name, _)| name == leader).unwrap().1;
    let mut client = connect_within(&node_config(port), CONNECT_TIMEOUT).expect("connect to the leader");
    let since: String = client.query_one("SELECT now()::text", &[]).unwrap().get(0);
    let swept_since = "SELECT last_run_at > $1::text::timestamptz FROM fence.sweeper";
    let swept = pg_fence_integration::eventually(Duration::from_secs(15), || {
        client.query_one(swept_since, &[&since]).is_ok_and(|row| row.get(0))
    });
    let mut only_on_leader = swept;
    for (name, port) in nodes(dsn) {
        let Ok(mut node) = connect_within(&node_config(port), CONNECT_TIMEOUT) else {
            lines.push(format!("{name}: not answering (rejoining)"));
            continue;
        };
        let row = node
            .query_one(
                "SELECT pg_is_in_recovery(),
                        (SELECT string_agg(pid::text, ',') FROM pg_stat_activity
                          WHERE backend_type = 'pg_fence sweeper'),
                        last_run_at::text, last_swept, total_swept
                   FROM fence.sweeper",
                &[],
            )
            .unwrap();
        let (standby, workers): (bool, Option<String>) = (row.get(0), row.get(1));
        let role = if standby { "standby" } else { "primary" };
        let worker =
            workers.as_deref().map_or("no sweeper worker".to_string(), |pids| format!("sweeper pid {pids}"));
        let figures = format!(
            "fence.sweeper last_run_at {} last_swept {} total_swept {}",
            row.get::<_, String>(2),
            row.get::<_, i64>(3),
            row.get::<_, i64>(4)
        );
        let note = if standby {
            " (replicated from the primary)"
        } else if swept {
            " (swept since it took over)"
        } else {
            " (NO sweep since it took over)"
        };
        lines.push(format!("{name} {role}: {worker}; {figures}{note}"));
        only_on_leader &= (name == leader) == workers.is_some() && (name == leader) != standby;
    }
    (lines, only_on_leader)
}

/// What a mode's run found, for the summary.
struct Summary {
    report: Report,
    failovers: Vec<Failover>,
    sweeper_only_on_leader: bool,
    /// The election's summary line, and what it found wrong.
    election: (String, Vec<String>),
}

/// The torture workload through the multi-host string for PG_FENCE_HA_SECONDS, with the four
/// failovers spread over it, then the checker.
fn run(synchronous: bool) -> Summary {
    let dsn = Dsn::parse(&ha(&["dsn"]).expect("pg_test/ha dsn: start the cluster with pg_test/run-ha"));
    let config = std::fs::read_to_string(format!("{}/ha/node1/patroni.yml", test_root())).unwrap();
    let sync_mode = config.contains("synchronous_mode: true");
    assert_eq!(sync_mode, synchronous, "the cluster runs in the other mode: see pg_test/run-ha");

    let duration = Duration::from_secs(ha_seconds());
    let workload = Workload {
        duration,
        // Longer TTLs than the crash torture's, so that some leases outlive a quick failover and
        // their holders carry on under them on the new primary.
        ttl_ms: 50..2_000,
        // The server faults are the failovers below; the chaos thread throws the client faults.
        faults: vec![Fault::Pause, Fault::KillClient, Fault::TerminateBackend],
        call_timeout: Some(Duration::from_secs(5)),
        resume_after_reconnect: true,
        history_may_be_lost: !synchronous,
        ..Workload::default()
    };
    let connect = || dsn.connect().map_err(|_| connect_error());
    let failovers = Mutex::new(Vec::new());
    let sweeper_ok = Mutex::new(true);
    let kinds = [Kind::KillLeader, Kind::PauseLeader, Kind::StopPatroni, Kind::Switchover];
    let start = Instant::now();
    let election = election::Election::default();
    // In a database of its own, out of the torture checker's sight.
    let election_dsn = election::prepare(&mut dsn.connect().expect("connect to the primary"), &dsn);
    let connect_election = || election_dsn.connect();
    let report = thread::scope(|scope| {
        election.run(scope, &connect_election, start + duration);
        scope.spawn(|| {
            let mut next = Duration::ZERO;
            for (i, kind) in kinds.into_iter().enumerate() {
                // Spread over the run, a few seconds apart at least; none that could still be going
                // on when the clients stop (the checker then reads the history).
                let at = duration.mul_f64((i as f64 + 0.25) / kinds.len() as f64).max(next);
                thread::sleep(at.saturating_sub(start.elapsed()));
                let takes = if let Kind::PauseLeader = kind { PAUSE_SECONDS + 5 } else { 10 };
                if start.elapsed() + Duration::from_secs(takes) > duration {
                    eprintln!("ha: no time left for {kind:?}");
                    break;
                }
                let failover = fail_over(kind, &dsn);
                ha(&["wait-healthy", "60"]);
                let (lines, ok) = sweeper_evidence(&failover.to, &dsn);
                println!("after {kind:?} ({} -> {}):", failover.from, failover.to);
                lines.iter().for_each(|line| println!("  {line}"));
                *sweeper_ok.lock().unwrap() &= ok;
                failovers.lock().unwrap().push(failover);
                next = start.elapsed() + Duration::from_secs(3);
            }
        });
        torture::run(&workload, &connect, None)
    });
    let mut primary = election_dsn.connect().expect("connect to the primary after the run");
    Summary {
        report,
        failovers: failovers.into_inner().unwrap(),
        sweeper_only_on_leader: sweeper_ok.into_inner().unwrap(),
        election: election.check(&mut primary),
    }
}

/// The Connect type wants a postgres::Error: make one from a refused connection.
fn connect_error() -> postgres::Error {
    Client::connect("host=127.0.0.1 port=1 connect_timeout=1", NoTls).err().unwrap()
}

fn test_root() -> String {
    std::env::var("PG_FENCE_TEST_DIR").unwrap_or_else(|_| "/tmp/pg_fence_test".into())
}

/// Prints the summary line run-ha collects, and returns (reissued fences, stale writes landed).
fn summarize(mode: &str, summary: &Summary) -> (u64, u64) {
    let (c, v) = (&summary.report.counts, &summary.report.violations);
    // AcknowledgedLeaseLost counts, in synchronous mode, the missing grants and renewals too (they
    // are in `lost`): what remains is a fence recorded for another grant, i.e. handed out again.
    let missing = if mode == "sync" { c.lost.grants + c.lost.renewals } else { 0 };
    let reissued = v.of(Violation::FenceNotIncreasing) + v.of(Violation::AcknowledgedLeaseLost) - missing;
    let stale_landed = v.of(Violation::LateWrite);
    let durations: Vec<String> =
        summary.failovers.iter().map(|f| format!("{:?} {:.1}s", f.kind, f.seconds)).collect();
    println!(
        "HA SUMMARY mode={mode} grants={} acked_grants_lost={} acked_writes_lost={} unknown_outcomes={} \
         reissued_fences={reissued} stale_writes_landed={stale_landed} violations={} failovers={} [{}] \
         sweeper_only_on_primary={}",
        c.grants,
        c.lost.grants,
        c.lost.writes,
        c.unknown,
        v.total(),
        summary.failovers.len(),
        durations.join(", "),
        summary.sweeper_only_on_leader
    );
    println!("HA SUMMARY mode={mode} {}", summary.election.0);
    (reissued, stale_landed)
}

fn assert_common(summary: &Summary) {
    let c = &summary.report.counts;
    assert_eq!(summary.failovers.len(), 4, "all four failovers made (PG_FENCE_HA_SECONDS too short?)");
    assert!(summary.sweeper_only_on_leader, "the sweeper worker ran on the primary only, and swept");
    assert!(summary.election.1.is_empty(), "leader election: {:?}", summary.election.1);
    assert!(c.grants >= 100 && c.accepted_writes >= 100, "too little work to mean anything");
    assert_eq!(
        c.unexpected_errors, 0,
        "errors that no fault explains: {:?}",
        summary.report.unexpected_errors
    );
}

#[test]
#[ignore = "needs pg_test/ha start --sync (pg_test/run-ha)"]
fn failovers_with_synchronous_replication() {
    let summary = run(true);
    summarize("sync", &summary);
    assert_eq!(summary.report.violations.total(), 0, "violations (nothing acknowledged may be lost)");
    assert_common(&summary);
}

#[test]
#[ignore = "needs pg_test/ha start (pg_test/run-ha)"]
fn failovers_with_asynchronous_replication() {
    let summary = run(false);
    let (reissued, stale_landed) = summarize("async", &summary);
    assert_eq!((reissued, stale_landed), (0, 0), "reissued fences, stale writes landed");
    assert_eq!(summary.report.violations.total(), 0, "violations of the invariants on the history kept");
    assert_common(&summary);
}
