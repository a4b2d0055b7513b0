//! pg_fence behind PgBouncer in transaction pooling mode, where many client connections share a few
//! server connections and each transaction may run on another one. Plain leases and fenced writes
//! carry all they need in their arguments (key, token, fence), so any client can use them on any
//! server connection. A session-bound lease is bound to the server connection instead, which outlives
//! the client: docs/reference.md says so ("It needs a direct or session-pooled connection"), and the second
//! test shows what happens.
//!
//! Needs Debian's pgbouncer at /usr/sbin/pgbouncer (pg_test/setup installs it). It refuses to run as
//! root, so it runs as the postgres user, in the foreground, as a child process killed on drop.
use pg_fence_integration::{acquire, eventually, port, sqlstate, Acquire, Cluster};
use postgres::types::{ToSql, Type};
use postgres::{Client, NoTls, Row};
use std::collections::BTreeSet;
use std::fs;
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

const PGBOUNCER: &str = "/usr/sbin/pgbouncer";
/// Bounds how long a broken test hangs; never a measure of speed.
const GENEROUS: Duration = Duration::from_secs(20);

/// A PgBouncer in transaction pooling mode in front of a scratch cluster's database `postgres`.
struct PgBouncer {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl PgBouncer {
    /// Starts PgBouncer on `port` with at most `pool_size` server connections to the cluster on
    /// `server_port`, and waits until it accepts connections.
    fn start(name: &str, server_port: u16, port: u16, pool_size: usize) -> PgBouncer {
        assert!(
            Path::new(PGBOUNCER).exists(),
            "{PGBOUNCER} not found: install Debian's pgbouncer package (pg_test/setup does)"
        );
        let root = std::env::var("PG_FENCE_TEST_DIR").unwrap_or_else(|_| "/tmp/pg_fence_test".into());
        let dir = PathBuf::from(root).join(format!("pgbouncer_{name}"));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        // auth_type = any: no password, every client logs in as the user of the [databases] line (the
        // cluster trusts loopback connections). No Unix socket, which could collide with another
        // PgBouncer's in /tmp. server_reset_query is not used in transaction mode, so nothing runs
        // DISCARD ALL between clients; server connections stay open while idle for the whole test.
        let config = format!(
            "[databases]
postgres = host=127.0.0.1 port={server_port} dbname=postgres user=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = {pool_size}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 100
server_idle_timeout = 600
"
        );
        let config_path = dir.join("pgbouncer.ini");
        fs::write(&config_path, config).unwrap();
        // Readable by the postgres user whatever the umask.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(&config_path, fs::Permissions::from_mode(0o644)).unwrap();
        // The log file is opened here, as root; PgBouncer writes to it through the inherited descriptor.
        let log = fs::File::create(dir.join("pgbouncer.log")).unwrap();
        let child = Command::new(PGBOUNCER)
            .arg(&config_path)
            .uid(postgres_id("-u"))
            .gid(postgres_id("-g"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|err| panic!("cannot start {PGBOUNCER}: {err}"));
        // From here on, a panic drops `bouncer`, which kills PgBouncer.
        let mut bouncer = PgBouncer { child, dir, port };
        let ready = eventually(GENEROUS, || {
            if let Some(status) = bouncer.child.try_wait().unwrap() {
                panic!("pgbouncer exited with {status}:\n{}", bouncer.log());
            }
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        assert!(ready, "pgbouncer does not accept connections on port {port}:\n{}", bouncer.log());
        bouncer
    }

    /// A client connection to PgBouncer (not to the server).
    fn try_connect(&self) -> Result<Client, postgres::Error> {
        let config = format!("host=127.0.0.1 port={} user=postgres dbname=postgres", self.port);
        Client::connect(&config, NoTls)
    }

    fn connect(&self) -> Client {
        self.try_connect().unwrap_or_else(|err| panic!("connect to pgbouncer: {err}\n{}", self.log()))
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The postgres user's uid (`-u`) or gid (`-g`).
fn postgres_id(which: &str) -> u32 {
    let output = Command::new("id").args([which, "postgres"]).output().expect("run id");
    assert!(output.status.success(), "no postgres user");
    String::from_utf8(output.stdout).unwrap().trim().parse().unwrap()
}

// Every statement sent through PgBouncer goes as an unnamed statement in one round trip
// (query_typed): a named prepared statement, which `query` would create, stays on the server
// connection it was prepared on, and the next transaction may run on another one.

fn one(
    client: &mut Client,
    sql: &str,
    params: &[(&(dyn ToSql + Sync), Type)],
) -> Result<Row, postgres::Error> {
    client.query_typed_one(sql, params)
}

/// fenced_update of row `id` of table items: records the key as its writer.
fn fenced_update(client: &mut Client, key: &str, fence: i64, id: i32) -> Result<i64, postgres::Error> {
    one(
        client,
        "SELECT fence.fenced_update($1, $2, 'items', jsonb_build_object('writer', $1), jsonb_build_object('id', $3))",
        &[(&key, Type::TEXT), (&fence, Type::INT8), (&id, Type::INT4)],
    )
    .map(|row| row.get(0))
}

/// An UPDATE guarded by fence_guard: counts a write in row `id`; the number of rows updated.
fn guarded_increment(client: &mut Client, key: &str, fence: i64, id: i32) -> Result<u64, postgres::Error> {
    client.execute_typed(
        "UPDATE items SET writes = writes + 1 WHERE id = $3 AND fence.fence_guard($1, $2)",
        &[(&key, Type::TEXT), (&fence, Type::INT8), (&id, Type::INT4)],
    )
}

fn backend_pid(client: &mut Client) -> i32 {
    one(client, "SELECT pg_backend_pid()", &[]).unwrap().get(0)
}

/// The server backends serving clients other than `admin` itself: PgBouncer's server connections.
fn server_connections(admin: &mut Client) -> i64 {
    admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
            &[],
        )
        .unwrap()
        .get(0)
}

const CLIENTS: usize = 8;
const POOL_SIZE: usize = 2;
const ROUNDS: i64 = 25;

/// Eight client connections over two server connections: one lease passed from client to client (a
/// token or fence obtained through one client works through any other), then all eight clients at
/// once, each acquiring, writing under its fence, renewing and releasing its own key.
#[test]
fn leases_and_fenced_writes_work_across_pooled_connections() {
    let cluster = Cluster::start("pooler_plain", 27210, &[]);
    let bouncer = PgBouncer::start("plain", cluster.port(), port(27211), POOL_SIZE);
    let mut admin = cluster.connect();
    admin
        .batch_execute(
            "CREATE TABLE items (id int PRIMARY KEY, writer text, writes int NOT NULL DEFAULT 0);
             INSERT INTO items (id) SELECT generate_series(0, 7);",
        )
        .unwrap();
    let mut clients: Vec<Client> = (0..CLIENTS).map(|_| bouncer.connect()).collect();

    let job = acquire(&mut clients[0], "job", "1 hour").unwrap();
    let fence = job.fence;
    job.renew(&mut clients[1], "1 hour").unwrap();
    assert_eq!(guarded_increment(&mut clients[2], "job", fence, 0).unwrap(), 1);
    assert_eq!(fenced_update(&mut clients[3], "job", fence, 0).unwrap(), 1);
    let err = fenced_update(&mut clients[4], "job", fence + 1, 0).unwrap_err();
    assert_eq!(sqlstate(&err), "PF002", "a fence from the future: {err}");
    assert!(job.release(&mut clients[5]), "the token from another client released nothing");
    assert!(!job.release(&mut clients[6]), "a second release ended a lease");
    let next_fence = acquire(&mut clients[7], "job", "1 hour").expect("the key was released").fence;
    assert!(next_fence > fence, "fence {next_fence} granted after {fence}");
    let err = fenced_update(&mut clients[0], "job", fence, 0).unwrap_err();
    assert_eq!(sqlstate(&err), "PF002", "the old holder's write: {err}");
    let err = guarded_increment(&mut clients[1], "job", fence, 0).unwrap_err();
    assert_eq!(sqlstate(&err), "PF002", "the old holder's guarded write: {err}");
    let err = job.renew(&mut clients[2], "1 hour").unwrap_err();
    assert_eq!(sqlstate(&err), "PF001", "the old holder's renewal: {err}");

    // All clients at once. Each records the server backends its statements ran on.
    let backends = Arc::new(Mutex::new(BTreeSet::new()));
    let workers: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, mut client)| {
            let backends = Arc::clone(&backends);
            thread::spawn(move || {
                let (key, id) = (format!("worker-{i}"), i as i32);
                let mut fences = Vec::new();
                for _ in 0..ROUNDS {
                    let lease = acquire(&mut client, &key, "1 hour").expect("nobody else uses this key");
                    let fence = lease.fence;
                    assert_eq!(guarded_increment(&mut client, &key, fence, id).unwrap(), 1);
                    assert_eq!(fenced_update(&mut client, &key, fence, id).unwrap(), 1);
                    lease.renew(&mut client, "1 hour").unwrap();
                    backends.lock().unwrap().insert(backend_pid(&mut client));
                    assert!(lease.release(&mut client));
                    fences.push(fence);
                }
                fences
            })
        })
        .collect();
    for worker in workers {
        let fences = worker.join().unwrap();
        assert_eq!(fences.len() as i64, ROUNDS);
        assert!(
            fences.windows(2).all(|pair| pair[0] < pair[1]),
            "fences not strictly increasing: {fences:?}"
        );
    }

    // Row 0 also took the one guarded write under "job" above.
    let rows = admin.query("SELECT id, writer, writes FROM items ORDER BY id", &[]).unwrap();
    for row in rows {
        let (id, writer, writes): (i32, String, i32) = (row.get(0), row.get(1), row.get(2));
        assert_eq!(writer, format!("worker-{id}"));
        assert_eq!(i64::from(writes), ROUNDS + i64::from(id == 0));
    }
    // The eight clients really shared at most two server connections.
    let backends = backends.lock().unwrap();
    println!("{CLIENTS} clients ran on {} server connections: {backends:?}", backends.len());
    assert!(backends.len() <= POOL_SIZE, "more server connections than the pool allows: {backends:?}");
    assert!(server_connections(&mut admin) <= POOL_SIZE as i64);
}

/// A session-bound lease taken through PgBouncer in transaction mode is bound to the server
/// connection, not to the client: when the client disconnects, the server connection stays in the
/// pool and so does the lease, even for the next client served on that connection. Only the end of
/// the server connection ends it. (docs/reference.md documents session-bound leases as unsupported behind
/// transaction pooling for exactly this reason; this test pins what really happens.)
#[test]
fn a_session_bound_lease_behind_transaction_pooling_ends_with_the_server_connection() {
    let cluster = Cluster::start("pooler_session", 27212, &[]);
    // One server connection, so that every client is served on it.
    let bouncer = PgBouncer::start("session", cluster.port(), port(27213), 1);
    let mut admin = cluster.connect();

    let mut holder = bouncer.connect();
    let server_pid = backend_pid(&mut holder);
    let fence = Acquire::new("leader", "1 hour").session_bound(true).run(&mut holder).unwrap().fence;
    let session_pid: Option<i32> =
        admin.query_one("SELECT session_pid FROM fence.leases WHERE key = 'leader'", &[]).unwrap().get(0);
    assert_eq!(session_pid, Some(server_pid), "the lease is bound to the server connection");

    drop(holder);
    // With a direct connection the key is free within a second of the disconnect (sessions.rs);
    // give it more than that.
    thread::sleep(Duration::from_millis(1500));
    let server_alive: bool = admin
        .query_one("SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)", &[&server_pid])
        .unwrap()
        .get(0);
    assert!(server_alive, "PgBouncer closed its server connection");
    let live: bool =
        admin.query_one("SELECT live FROM fence.leases WHERE key = 'leader'", &[]).unwrap().get(0);
    assert!(live, "the lease ended with the client, although its server connection is still there");
    assert!(acquire(&mut admin, "leader", "1 hour").is_none(), "a direct client took the key");

    // The next client of the pool is served on the same server connection, the holder's "session":
    // it sees the lease as held too, although its own client never took it.
    let mut next = bouncer.connect();
    assert_eq!(backend_pid(&mut next), server_pid);
    assert!(
        Acquire::new("leader", "1 hour").session_bound(true).run(&mut next).is_none(),
        "the next client of the pool took the key"
    );
    drop(next);

    // Ending the server connection ends the lease: a client of the pool (on a new server
    // connection) takes the key with a higher fence. The first tries may meet the connection being
    // closed; they are retried with a new client.
    admin.query_one("SELECT pg_terminate_backend($1)", &[&server_pid]).unwrap();
    let mut granted = None;
    let taken = eventually(GENEROUS, || {
        granted = bouncer.try_connect().ok().and_then(|mut client| {
            Acquire::new("leader", "1 hour").try_run(&mut client).ok().flatten().map(|lease| lease.fence)
        });
        granted.is_some()
    });
    assert!(taken, "the key stayed held after its server connection ended:\n{}", bouncer.log());
    let granted = granted.unwrap();
    assert!(granted > fence, "fence {granted} granted after {fence}");
}
