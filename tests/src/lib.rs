//! Harness for the client integration tests: scratch clusters started through `pg_test/cluster`
//! (as the `postgres` user, on loopback), and small helpers shared by the tests.
use postgres::{Client, NoTls};
use std::path::PathBuf;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

pub mod bench;
pub mod fake_clock;
mod lease;
pub mod random_history;
pub mod torture;

pub use lease::{acquire, Acquire, Lease};

/// A scratch cluster with pg_fence created in database `postgres`. Destroyed when dropped.
pub struct Cluster {
    name: String,
    port: u16,
}

fn cluster_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../pg_test/cluster")
}

fn run_script(args: &[&str]) {
    let status = Command::new(cluster_script()).args(args).status().expect("run pg_test/cluster");
    assert!(status.success(), "pg_test/cluster {args:?} failed");
}

/// A test's port, moved by $PG_FENCE_PORT_OFFSET (0 by default): two runs of the suites side by
/// side (one against a build of its own, through $PG_BIN and $PG_FENCE_TEST_DIR) need apart ports.
pub fn port(port: u16) -> u16 {
    let offset = std::env::var("PG_FENCE_PORT_OFFSET")
        .map_or(0, |s| s.parse().expect("PG_FENCE_PORT_OFFSET: a number"));
    port.checked_add(offset).expect("PG_FENCE_PORT_OFFSET moves a port beyond 65535")
}

/// Creates (not starts) the cluster "it_" + `name`, destroying what an earlier run left; returns
/// its name. A cluster that then fails to start is left in place, server.log included.
fn create(name: &str, port: u16, settings: &[&str]) -> String {
    let name = format!("it_{name}");
    let _ = Command::new(cluster_script()).args(["destroy", &name]).status();
    let port_text = port.to_string();
    let mut args = vec!["create", &name, &port_text];
    // The run's settings first: a test's own come later in postgresql.conf, and win.
    let extra = extra_settings();
    args.extend(extra.iter().map(String::as_str));
    args.extend_from_slice(settings);
    if edition() == Edition::Sql {
        // The SQL edition has no library to preload (pg_test/cluster preloads pg_tle, which such a
        // line would replace): its fast leases are in the unlogged table, its sweep by calls.
        args.retain(|setting| !setting.starts_with("shared_preload_libraries="));
    }
    run_script(&args);
    name
}

/// Settings for every cluster of the run, from PG_FENCE_TEST_SETTINGS (space-separated
/// postgresql.conf lines): so the same tests check fast leases in shared memory
/// (`shared_preload_libraries=pg_fence pg_fence.fast_leases=10000`) and in the unlogged table.
fn extra_settings() -> Vec<String> {
    std::env::var("PG_FENCE_TEST_SETTINGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// Which pg_fence the clusters of this run serve: the C extension, or the SQL edition (issue 43,
/// sql/edition/) when $PG_FENCE_EDITION is `sql` (pg_test/cluster reads it too).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Edition {
    Extension,
    Sql,
}

pub fn edition() -> Edition {
    match std::env::var("PG_FENCE_EDITION").as_deref() {
        Ok("sql") => Edition::Sql,
        _ => Edition::Extension,
    }
}

/// For a test of what the SQL edition does not have by design (shared memory, the background
/// worker, guard_timeout, fence.stats's counters, pg_fence.* settings in postgresql.conf or SET,
/// server log lines): true, after saying why, when this run is against the SQL edition, and the
/// test returns at once. tests/regress/sql-edition/README.md lists these tests.
pub fn skipped_on_the_sql_edition(why: &str) -> bool {
    if edition() == Edition::Sql {
        println!("skipped on the SQL edition: {why}");
        return true;
    }
    false
}

/// Why the SQL edition skips the tests of the background worker (shared_preload_libraries=pg_fence).
pub const WORKER: &str =
    "the background worker (the sweeper, guard_timeout) needs pg_fence's library preloaded; \
     the edition's sweep is fence.sweep() by pg_cron, and each grant's of its own key";

/// Why the SQL edition skips the tests of a guard in a subtransaction that rolls back.
pub const GUARD_IN_SUBTRANSACTION: &str = "its guard lock is PostgreSQL's pg_advisory_xact_lock_shared, which a rolled-back \
     subtransaction (ROLLBACK TO SAVEPOINT, an EXCEPTION block) gives back; PL/pgSQL has no lock that outlives it and \
     ends with the transaction (issue 43 allows it; docs/sql-edition.md says which writes it still protects)";

/// Why the SQL edition skips the tests of a waiter whose client has gone.
pub const CLIENT_GONE: &str =
    "PL/pgSQL cannot look at its client's connection: a waiter whose client has gone is \
     ended only with client_connection_check_interval set (docs/sql-edition.md)";

/// The pg_fence.* settings of postgresql.conf that the SQL edition keeps in table fence.settings
/// instead (sql/edition/settings.sql), with the unit the extension's setting has ("" for a boolean).
const EDITION_SETTINGS: [(&str, &str); 4] = [
    ("pg_fence.max_ttl", "s"),
    ("pg_fence.retain_ended", "s"),
    ("pg_fence.observe_interval", "ms"),
    ("pg_fence.notify_keys", ""),
];

/// On the SQL edition, the settings of `settings` that it keeps in fence.settings, written there
/// (as fence_admin may): so a test's `pg_fence.retain_ended=0` means the same on both editions.
fn apply_edition_settings(client: &mut Client, settings: &[String]) {
    for setting in settings {
        let Some((name, value)) = setting.split_once('=') else { continue };
        let Some((_, unit)) = EDITION_SETTINGS.iter().find(|(known, _)| *known == name) else { continue };
        let value = if !unit.is_empty() && value.chars().all(|c| c.is_ascii_digit()) {
            format!("{value} {unit}")
        } else {
            value.to_owned()
        };
        let cast = if unit.is_empty() { "$2::text::boolean::text" } else { "$2::text::interval::text" };
        client
            .execute(
                &format!("UPDATE fence.settings SET value = {cast} WHERE name = $1"),
                &[&name.trim_start_matches("pg_fence."), &value],
            )
            .unwrap();
    }
}

/// `SET pg_fence.NAME = 'VALUE'` for this session on the extension; on the SQL edition, which
/// keeps max_ttl, retain_ended, observe_interval and notify_keys in fence.settings for the whole database, that
/// row (the caller must be fence_admin).
pub fn set_fence_setting(client: &mut Client, name: &str, value: &str) {
    if edition() == Edition::Sql {
        apply_edition_settings(client, &[format!("pg_fence.{name}={value}")]);
    } else {
        client.batch_execute(&format!("SET pg_fence.{name} = '{value}'")).unwrap();
    }
}

/// Whether this run keeps fast leases in shared memory (see `extra_settings`).
pub fn fast_leases_in_memory() -> bool {
    extra_settings()
        .iter()
        .any(|setting| setting.starts_with("pg_fence.fast_leases=") && !setting.ends_with("=0"))
}

/// `pg_test/cluster start NAME` with extra environment variables. Run by bash itself, not through
/// the script's `#!/usr/bin/env bash`: the first process libfaketime is loaded into creates its
/// objects in /dev/shm and removes them when it exits, which `env` never does (it execs bash), so
/// they would be left behind.
fn start_script_with_env(name: &str, env: &[(&str, &str)]) {
    let status = Command::new("bash")
        .arg(cluster_script())
        .args(["start", name])
        .envs(env.iter().copied())
        .status()
        .expect("run pg_test/cluster");
    assert!(status.success(), "pg_test/cluster start {name} with {env:?} failed");
}

impl Cluster {
    /// Creates and starts a cluster. Each test uses its own `name` and `port` so tests can run in
    /// parallel. `settings` are postgresql.conf lines such as "wal_writer_delay=10s".
    pub fn start(name: &str, port: u16, settings: &[&str]) -> Cluster {
        Cluster::start_with_env(name, port, settings, &[])
    }

    /// The same, with extra environment variables for the server (such as LD_PRELOAD, to run it
    /// under libfaketime). They are set for `pg_test/cluster start`, whose runuser and pg_ctl pass
    /// them on to the postmaster and so to every backend; a later `restart` does not set them.
    pub fn start_with_env(name: &str, port: u16, settings: &[&str], env: &[(&str, &str)]) -> Cluster {
        let port = self::port(port);
        let name = create(name, port, settings);
        start_script_with_env(&name, env);
        let cluster = Cluster { name, port };
        let mut client = cluster.connect();
        client.batch_execute("CREATE EXTENSION pg_fence").unwrap();
        if edition() == Edition::Sql {
            let mut all = extra_settings();
            all.extend(settings.iter().map(|s| s.to_string()));
            apply_edition_settings(&mut client, &all);
        }
        cluster
    }

    /// The same as `start`, without CREATE EXTENSION.
    pub fn start_without_extension(name: &str, port: u16, settings: &[&str]) -> Cluster {
        let port = self::port(port);
        let name = create(name, port, settings);
        run_script(&["start", &name]);
        Cluster { name, port }
    }

    /// A streaming standby of `primary` (pg_basebackup -R), started; its application_name is its
    /// cluster name, "it_" + `name`, for the primary's synchronous_standby_names.
    pub fn start_standby(name: &str, primary: &Cluster, port: u16, settings: &[&str]) -> Cluster {
        let port = self::port(port);
        let name = format!("it_{name}");
        let _ = Command::new(cluster_script()).args(["destroy", &name]).status();
        let port_text = port.to_string();
        let mut args = vec!["standby", &name, &primary.name, &port_text];
        args.extend_from_slice(settings);
        run_script(&args);
        run_script(&["start", &name]);
        Cluster { name, port }
    }

    /// Waits until the server accepts connections (after it restarted by itself, say).
    pub fn wait_until_ready(&self) {
        assert!(
            eventually(Duration::from_secs(60), || self.try_connect().is_ok()),
            "{} never came back",
            self.name
        );
    }

    /// Promotes a standby to primary, waiting until it accepts writes.
    pub fn promote(&self) {
        run_script(&["promote", &self.name]);
    }

    pub fn connect(&self) -> Client {
        self.try_connect().expect("connect to scratch cluster")
    }

    /// A connection to another database of the cluster.
    pub fn connect_to(&self, database: &str) -> Client {
        self.try_connect_to(database).expect("connect to scratch cluster")
    }

    /// A connection to database `postgres` as another role (trust authentication).
    pub fn connect_as(&self, user: &str) -> Client {
        let config = format!(
            "host=127.0.0.1 port={} user={user} dbname=postgres application_name=pg_fence_it",
            self.port
        );
        Client::connect(&config, NoTls).expect("connect to scratch cluster")
    }

    /// The server's log file (pg_test/cluster starts the server with `-l` there).
    pub fn log_path(&self) -> PathBuf {
        let root = std::env::var("PG_FENCE_TEST_DIR").unwrap_or_else(|_| "/tmp/pg_fence_test".into());
        PathBuf::from(root).join(&self.name).join("server.log")
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn try_connect(&self) -> Result<Client, postgres::Error> {
        self.try_connect_to("postgres")
    }

    fn try_connect_to(&self, database: &str) -> Result<Client, postgres::Error> {
        let config = format!(
            "host=127.0.0.1 port={} user=postgres dbname={database} application_name=pg_fence_it",
            self.port
        );
        Client::connect(&config, NoTls)
    }

    /// kill -9 of the postmaster and every backend: unflushed WAL in shared memory is lost.
    pub fn crash(&self) {
        run_script(&["crash", &self.name]);
    }

    /// Stops the server cleanly (a shutdown checkpoint) and starts it again.
    pub fn stop_and_start(&self) {
        run_script(&["stop", &self.name]);
        run_script(&["start", &self.name]);
    }

    /// Stops the server in `mode`: "fast" (a shutdown checkpoint), "smart", or "immediate" (no
    /// checkpoint: the next start runs crash recovery, and empties unlogged tables).
    pub fn stop(&self, mode: &str) {
        run_script(&["stop", &self.name, mode]);
    }

    /// Starts again after `crash` (PostgreSQL runs crash recovery).
    pub fn restart(&self) {
        run_script(&["start", &self.name]);
    }

    /// The same, with extra environment variables for the server, as `start_with_env` sets them.
    pub fn restart_with_env(&self, env: &[(&str, &str)]) {
        start_script_with_env(&self.name, env);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(cluster_script()).args(["destroy", &self.name]).status();
    }
}

/// The SQLSTATE of a failed call, or "" when the error did not come from the server.
pub fn sqlstate(err: &postgres::Error) -> String {
    err.code().map(|code| code.code().to_string()).unwrap_or_default()
}

/// Polls `check` until it is true or `limit` has passed. Limits are generous on purpose: they bound
/// how long a failing test hangs, they do not measure speed.
pub fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if check() {
            return true;
        }
        thread::sleep(Duration::from_millis(2));
    }
    false
}

/// Waits until `instant` (seconds since 1970, as a `Lease`'s `expires_at`) has passed by the
/// server's clock: for a test that lets a lease run out, as long as that takes, on a busy machine
/// too, rather than a fixed sleep past the TTL. It sleeps as long as the server says is left.
pub fn wait_until_past(client: &mut impl postgres::GenericClient, instant: f64) {
    let left = "SELECT $1 - extract(epoch FROM clock_timestamp())::float8";
    let start = Instant::now();
    loop {
        let left: f64 = client.query_one(left, &[&instant]).unwrap().get(0);
        if left < 0.0 {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(600), "{left} s still left after 10 minutes");
        thread::sleep(Duration::from_secs_f64(left) + Duration::from_millis(1));
    }
}

/// Sends a signal (such as "-STOP") to a process, a client or a server backend.
pub fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill").args([signal, &pid.to_string()]).status().unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

/// The pid of the server backend serving `client`.
pub fn backend_pid(client: &mut Client) -> i32 {
    client.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0)
}

/// Whether the backend `pid` comes to wait on `wait_event_type` ("Lock", "Extension", ...) within a
/// generous 20 s, as pg_stat_activity shows it.
pub fn comes_to_wait_on(observer: &mut Client, pid: i32, wait_event_type: &str) -> bool {
    eventually(Duration::from_secs(20), || wait_event(observer, pid).0.as_deref() == Some(wait_event_type))
}

/// What the backend `pid` is waiting on, as pg_stat_activity says: (wait_event_type, wait_event).
/// On the SQL edition, whose waiters look again every few ms in pg_sleep where the extension's
/// sleep on their latch (sql/edition/acquire.sql), ("Timeout", "PgSleep") reads as the
/// extension's ("Extension", "Extension").
pub fn wait_event(client: &mut Client, pid: i32) -> (Option<String>, Option<String>) {
    let row = client
        .query_one(
            "SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE pid = $1 AND state = 'active'
             UNION ALL SELECT NULL, NULL LIMIT 1",
            &[&pid],
        )
        .unwrap();
    let event: (Option<String>, Option<String>) = (row.get(0), row.get(1));
    if edition() == Edition::Sql && event.1.as_deref() == Some("PgSleep") {
        return (Some("Extension".into()), Some("Extension".into()));
    }
    event
}

/// The major version the scratch clusters run: $PG_MAJOR, as for pg_test/cluster; 15 by default.
pub fn pg_major() -> String {
    std::env::var("PG_MAJOR").unwrap_or_else(|_| "15".into())
}

/// A PostgreSQL program of the build the scratch clusters run: from $PG_BIN when it is set, as
/// pg_test/cluster does, so that pg_dump and pg_restore match the server; else that major
/// version's.
pub fn pg_bin(program: &str) -> PathBuf {
    let bin = std::env::var("PG_BIN").unwrap_or_else(|_| format!("/usr/lib/postgresql/{}/bin", pg_major()));
    PathBuf::from(bin).join(program)
}

/// A command running a PostgreSQL client program (see `pg_bin`): inside the version's chroot
/// (pg_test/chroot) for 17 and 18, whose programs need its libraries.
pub fn pg_program(program: &str) -> Command {
    if pg_major() == "15" {
        return Command::new(pg_bin(program));
    }
    let chroot = Command::new(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../pg_test/chroot"))
        .args([&pg_major(), "dir"])
        .output()
        .expect("run pg_test/chroot");
    let mut command = Command::new("chroot");
    command.arg(String::from_utf8_lossy(&chroot.stdout).trim()).arg(pg_bin(program));
    command
}

/// Runs a PostgreSQL client program (see `pg_program`) and returns its standard output; panics with
/// its standard error when it fails.
pub fn run_pg_program(program: &str, args: &[&str]) -> String {
    let out = pg_program(program).args(args).output().unwrap_or_else(|err| panic!("{program}: {err}"));
    assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn test_root() -> PathBuf {
    PathBuf::from(std::env::var("PG_FENCE_TEST_DIR").unwrap_or_else(|_| "/tmp/pg_fence_test".into()))
}

impl Cluster {
    /// The cluster's name ("it_" + the name it was started with), which is also the
    /// application_name a standby connects to its primary with.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The pid of a standby's walreceiver, once it streams (waiting up to 30 s for that).
    pub fn walreceiver_pid(&self) -> u32 {
        let mut client = self.connect();
        let streaming = "SELECT pid FROM pg_stat_wal_receiver WHERE status = 'streaming'";
        let mut pid = None;
        let streams = eventually(Duration::from_secs(30), || {
            pid = client.query_opt(streaming, &[]).unwrap().map(|row| row.get::<_, i32>(0));
            pid.is_some()
        });
        assert!(streams, "{} never streamed", self.name);
        pid.unwrap() as u32
    }

    /// Waits until this standby has replayed all the WAL that `primary` (a connection to its primary)
    /// has inserted so far: the insert position, not the write position, so that commits that were
    /// not flushed (releases, fast leases) are waited for too, once the WAL writer has sent them.
    pub fn wait_until_replayed(&self, primary: &mut Client) {
        let lsn: String = primary.query_one("SELECT pg_current_wal_insert_lsn()::text", &[]).unwrap().get(0);
        let mut standby = self.connect();
        let replayed = "SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn";
        let caught_up =
            eventually(Duration::from_secs(30), || standby.query_one(replayed, &[&lsn]).unwrap().get(0));
        assert!(caught_up, "{} never replayed the primary's WAL up to {lsn}", self.name);
    }

    /// Makes the streaming `standby` this primary's synchronous standby, and waits until the primary
    /// says it is. Call it once the standby streams: from then on every commit waits for it.
    pub fn make_synchronous(&self, standby: &Cluster) {
        let mut admin = self.connect();
        let names = format!("ALTER SYSTEM SET synchronous_standby_names = '{}'", standby.name);
        admin.batch_execute(&names).unwrap();
        admin.batch_execute("SELECT pg_reload_conf()").unwrap();
        let sync = "SELECT 1 FROM pg_stat_replication WHERE sync_state = 'sync'";
        let synchronous =
            eventually(Duration::from_secs(30), || admin.query_opt(sync, &[]).unwrap().is_some());
        assert!(synchronous, "{} never became synchronous", standby.name);
    }

    /// A cluster made from a copy of `backup` that starts in archive recovery (recovery.signal) with
    /// `settings` (restore_command, recovery_target_*), and once it has recovered and been promoted
    /// (recovery_target_action = 'promote' among them) accepts writes. Destroyed when dropped.
    pub fn recover(name: &str, backup: &BaseBackup, port: u16, settings: &[&str]) -> Cluster {
        let port = self::port(port);
        let name = format!("it_{name}");
        let _ = Command::new(cluster_script()).args(["destroy", &name]).status();
        let port_text = port.to_string();
        let mut args = vec!["recover", &name, &backup.name, &port_text];
        args.extend_from_slice(settings);
        run_script(&args);
        run_script(&["start", &name]);
        let cluster = Cluster { name, port };
        let mut client = cluster.connect();
        let promoted = eventually(Duration::from_secs(60), || {
            !client.query_one("SELECT pg_is_in_recovery()", &[]).unwrap().get::<_, bool>(0)
        });
        assert!(promoted, "{} never left recovery (see {:?})", cluster.name, cluster.log_path());
        cluster
    }
}

/// A base backup of a running cluster (pg_basebackup), kept in the test root for `Cluster::recover`
/// until dropped.
pub struct BaseBackup {
    name: String,
}

impl BaseBackup {
    pub fn take(name: &str, of: &Cluster) -> BaseBackup {
        let name = format!("it_{name}");
        let _ = Command::new(cluster_script()).args(["destroy", &name]).status();
        run_script(&["backup", &name, &of.name]);
        BaseBackup { name }
    }
}

impl Drop for BaseBackup {
    fn drop(&mut self) {
        let _ = Command::new(cluster_script()).args(["destroy", &self.name]).status();
    }
}

/// A directory in the test root that the `postgres` user owns, for the servers to write to (a WAL
/// archive, say). Removed, with what is in it, when dropped.
pub struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    /// "it_" + `name` in the test root, emptied if an earlier run left it.
    pub fn create(name: &str) -> ScratchDir {
        let path = test_root().join(format!("it_{name}"));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        let status = Command::new("chown").arg("postgres").arg(&path).status().unwrap();
        assert!(status.success(), "chown postgres {path:?}");
        ScratchDir { path }
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// What a server rolled onto another history (a promoted standby that missed WAL, a recovered base
/// backup, a restored dump, the extension dropped and created again) makes of the fences issued
/// before: see `next_history`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NextHistory {
    /// Grants issued before whose fence it does not know: the key's current fence there is lower,
    /// or it has no row for the key. Tests assert this is not 0, or they would prove nothing.
    pub forgotten: usize,
    /// Keys whose next grant there got a fence at or below one issued before for that key.
    pub reissued: usize,
    /// Fences issued before that fence_guard accepts there after that next grant: a holder of the old
    /// history whose write would pass.
    pub stale_guards_accepted: usize,
}

/// Looks at the server behind `client` after `issued` (every (key, fence) granted before, on the old
/// history): counts the grants it forgot, grants every key once (waiting up to 30 s for a lease it
/// still has to end), and tries fence_guard with every fence issued before.
pub fn next_history(client: &mut Client, issued: &[(String, i64)]) -> NextHistory {
    let mut highest: std::collections::BTreeMap<&str, i64> = std::collections::BTreeMap::new();
    for (key, fence) in issued {
        let entry = highest.entry(key.as_str()).or_insert(*fence);
        *entry = (*entry).max(*fence);
    }
    let mut known = std::collections::BTreeMap::new();
    for key in highest.keys() {
        let current: Option<i64> = client.query_one("SELECT fence.current_fence($1)", &[key]).unwrap().get(0);
        known.insert(*key, current);
    }
    let forgotten =
        issued.iter().filter(|(key, fence)| known[key.as_str()].is_none_or(|k| k < *fence)).count();
    let mut reissued = 0;
    for (key, highest) in &highest {
        let next = Acquire::new(key, "1 minute").wait("30 seconds").run(client);
        reissued +=
            usize::from(next.unwrap_or_else(|| panic!("{key} still held after 30 s")).fence <= *highest);
    }
    let mut stale_guards_accepted = 0;
    for (key, fence) in issued {
        match client.query_one("SELECT fence.fence_guard($1, $2)", &[key, fence]) {
            Ok(_) => stale_guards_accepted += 1,
            Err(err) => assert_eq!(sqlstate(&err), "PF002", "fence_guard({key}, {fence}): {err}"),
        }
    }
    NextHistory { forgotten, reissued, stale_guards_accepted }
}

/// Makes `client`'s database ready for `wal_records_between` and `commit_flushed`: pg_walinspect,
/// and a table whose update forces a flush. Before VACUUM, whose pruning it needs.
pub fn inspect_wal(client: &mut Client) {
    client
        .batch_execute(
            "CREATE EXTENSION IF NOT EXISTS pg_walinspect;
             CREATE TABLE IF NOT EXISTS wal_flush_marker AS SELECT 0 AS n",
        )
        .unwrap();
}

/// Records that only background processes write, whichever session runs: the background writer's
/// running-transactions record (every 15 s when anything was written since its last one) and the
/// checkpointer's. A call of a session never writes them.
const BACKGROUND_RECORDS: &str = "NOT (resource_manager = 'Standby' AND record_type = 'RUNNING_XACTS'
                                      OR resource_manager = 'XLOG' AND record_type LIKE 'CHECKPOINT%')";

/// The WAL records written from `start` to `end`, as "resource manager/record type", leaving out
/// the background processes' own (BACKGROUND_RECORDS). Needs `inspect_wal`.
pub fn wal_records_between(client: &mut Client, start: &str, end: &str) -> Vec<String> {
    if start == end {
        return Vec::new(); // nothing written (15's pg_walinspect refuses an empty range)
    }
    flush_wal(client);
    let query = format!(
        "SELECT resource_manager || '/' || record_type FROM pg_get_wal_records_info($1::text::pg_lsn, $2::text::pg_lsn)
          WHERE {BACKGROUND_RECORDS} ORDER BY start_lsn"
    );
    client.query(&query, &[&start, &end]).unwrap().iter().map(|row| row.get(0)).collect()
}

/// Whether the last transaction that `client` committed since the WAL insert position `start` waited
/// for its flush: whether, right after that commit returned, the WAL was flushed past the end of its
/// commit record. It judges that record itself: WAL that other processes inserted meanwhile (the
/// background writer's running-transactions record, say) and nobody flushes does not count. None
/// when nothing committed wrote a commit record. Needs `inspect_wal`.
pub fn commit_flushed(client: &mut Client, start: &str) -> Option<bool> {
    let row = client
        .query_one("SELECT pg_current_wal_flush_lsn()::text, pg_current_wal_insert_lsn()::text", &[])
        .unwrap();
    let (flushed, inserted): (String, String) = (row.get(0), row.get(1));
    if start == inserted {
        return None; // nothing written (15's pg_walinspect refuses an empty range)
    }
    flush_wal(client);
    client
        .query_opt(
            "SELECT end_lsn <= $3::text::pg_lsn FROM pg_get_wal_records_info($1::text::pg_lsn, $2::text::pg_lsn)
              WHERE resource_manager = 'Transaction' AND record_type = 'COMMIT' ORDER BY start_lsn DESC LIMIT 1",
            &[&start, &inserted, &flushed],
        )
        .unwrap()
        .map(|row| row.get(0))
}

/// pg_walinspect reads only flushed WAL: commits a write that waits for its flush, which flushes
/// all WAL inserted before it.
fn flush_wal(client: &mut Client) {
    client
        .batch_execute(
            "BEGIN; SET LOCAL synchronous_commit = on; UPDATE wal_flush_marker SET n = n + 1; COMMIT",
        )
        .unwrap();
}

/// Raises the fast reservation (fence.fast_reserve) an hour ahead of the clock, so that no fast grant
/// of the next hour needs to raise it: a raise, once per two seconds of steady fast grants, takes a
/// transaction id and writes WAL, and a busy machine can stretch any loop past those two seconds.
/// Call it after the first fast grant since the server started: that grant takes its floor from the
/// reservation as it stands (a restart may have forgotten fast fences up to it), and would jump
/// above this one.
pub fn reserve_fast_fences_for_an_hour(client: &mut Client) {
    client
        .batch_execute(
            "INSERT INTO fence.fast_reserve (fence)
             SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint + 3600000000",
        )
        .unwrap();
}

pub fn wal_insert_position(client: &mut Client) -> String {
    client.query_one("SELECT pg_current_wal_insert_lsn()::text", &[]).unwrap().get(0)
}

/// The postmaster and every process it started, stopped with SIGSTOP (the postmaster first, so that
/// it forks nothing new meanwhile) until dropped, even when the test fails.
pub struct Frozen(Vec<u32>);

impl Frozen {
    pub fn server(cluster: &Cluster) -> Frozen {
        let root = std::env::var("PG_FENCE_TEST_DIR").unwrap_or_else(|_| "/tmp/pg_fence_test".into());
        let pidfile = std::fs::read_to_string(format!("{root}/{}/postmaster.pid", cluster.name())).unwrap();
        let postmaster: u32 = pidfile.lines().next().unwrap().trim().parse().unwrap();
        signal(postmaster, "-STOP");
        let mut pids = vec![postmaster];
        pids.extend(children(postmaster));
        for pid in &pids[1..] {
            signal(*pid, "-STOP");
        }
        Frozen(pids)
    }

    /// One server backend (`pid`), stopped: its client hears nothing from it; the server goes on.
    pub fn backend(pid: u32) -> Frozen {
        signal(pid, "-STOP");
        Frozen(vec![pid])
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        for pid in self.0.iter().rev() {
            signal(*pid, "-CONT");
        }
    }
}

/// The pids whose parent is `parent`.
fn children(parent: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // The command name, in parentheses, may hold spaces: the ppid is the second field after it.
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        if after.split(' ').nth(1).and_then(|ppid| ppid.parse::<u32>().ok()) == Some(parent) {
            found.push(pid);
        }
    }
    found
}
