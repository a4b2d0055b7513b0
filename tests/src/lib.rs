//! Harness for the client integration tests: scratch clusters started through `pg_test/cluster`
//! (as the `postgres` user, on loopback), and small helpers shared by the tests.
use postgres::{Client, NoTls};
use std::path::PathBuf;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

pub mod torture;

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

/// Creates (not starts) the cluster "it_" + `name`, destroying what an earlier run left; returns
/// its name. A cluster that then fails to start is left in place, server.log included.
fn create(name: &str, port: u16, settings: &[&str]) -> String {
    let name = format!("it_{name}");
    let _ = Command::new(cluster_script()).args(["destroy", &name]).status();
    let port_text = port.to_string();
    let mut args = vec!["create", &name, &port_text];
    args.extend_from_slice(settings);
    run_script(&args);
    name
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
        let name = create(name, port, settings);
        // Run by bash itself, not through the script's `#!/usr/bin/env bash`: the first process
        // libfaketime is loaded into creates its objects in /dev/shm and removes them when it exits,
        // which `env` never does (it execs bash), so they would be left behind.
        let status = Command::new("bash")
            .arg(cluster_script())
            .args(["start", &name])
            .envs(env.iter().copied())
            .status()
            .expect("run pg_test/cluster");
        assert!(status.success(), "pg_test/cluster start {name} with {env:?} failed");
        let cluster = Cluster { name, port };
        cluster.connect().batch_execute("CREATE EXTENSION pg_fence").unwrap();
        cluster
    }

    /// The same as `start`, without CREATE EXTENSION.
    pub fn start_without_extension(name: &str, port: u16, settings: &[&str]) -> Cluster {
        let name = create(name, port, settings);
        run_script(&["start", &name]);
        Cluster { name, port }
    }

    /// A streaming standby of `primary` (pg_basebackup -R), started; its application_name is its
    /// cluster name, "it_" + `name`, for the primary's synchronous_standby_names.
    pub fn start_standby(name: &str, primary: &Cluster, port: u16, settings: &[&str]) -> Cluster {
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

    /// Starts again after `crash` (PostgreSQL runs crash recovery).
    pub fn restart(&self) {
        run_script(&["start", &self.name]);
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
pub fn wait_event(client: &mut Client, pid: i32) -> (Option<String>, Option<String>) {
    let row = client
        .query_one(
            "SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE pid = $1 AND state = 'active'
             UNION ALL SELECT NULL, NULL LIMIT 1",
            &[&pid],
        )
        .unwrap();
    (row.get(0), row.get(1))
}
