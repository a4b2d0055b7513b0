//! Shared by the command's tests: scratch clusters from the repository's harness (tests/src), the
//! pg-fence binary that cargo built, run as a real process with the PG* environment of a cluster.
#![allow(dead_code, unused_imports)]
pub use pg_fence_integration::{eventually, signal, Cluster, Frozen, ScratchDir};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a test waits for a process that should end; a bound on a failing test's hang, not a
/// measure of speed.
pub const LIMIT: Duration = Duration::from_secs(60);

/// A cluster for one test, and a scratch directory for its commands' files.
pub struct Setup {
    pub cluster: Cluster,
    pub dir: ScratchDir,
}

impl Setup {
    pub fn new(name: &str, port: u16) -> Setup {
        let cluster = Cluster::start(name, port, &["fsync=off"]);
        Setup { cluster, dir: ScratchDir::create(&format!("cli_{name}")) }
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    /// `pg-fence ARGS` against the cluster, its output to files in the scratch directory.
    pub fn pg_fence(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pg-fence"));
        cmd.args(args)
            .env("PGHOST", "127.0.0.1")
            .env("PGPORT", self.cluster.port().to_string())
            .env("PGUSER", "postgres")
            .env("PGDATABASE", "postgres")
            .env_remove("PGSERVICE")
            .env_remove("PGSSLMODE")
            .current_dir(self.dir.path())
            .stdin(Stdio::null());
        cmd
    }

    /// Starts `pg-fence ARGS`, its stdout and stderr going to `NAME.out` and `NAME.err`.
    pub fn spawn(&self, name: &str, args: &[&str]) -> Process {
        self.start(name, self.pg_fence(args))
    }

    /// `pg-fence run ARGS -- CMD`, CMD touching `started` and then running until `go` exists;
    /// returned once CMD has started.
    pub fn hold_until(&self, name: &str, args: &[&str], started: &str, go: &str) -> Process {
        let script = format!("touch {started}; while [ ! -e {go} ]; do sleep 0.05; done");
        let process = self.spawn(name, &[&["run"], args, &["--"], &sh(&script)].concat());
        assert!(self.appears(started), "{name} started: {}", process.stderr());
        process
    }

    /// Starts `pg-fence ARGS` under `script(1)`, whose pseudo-terminal is pg-fence's stdin, stdout
    /// and stderr, as when a person runs it: both outputs go to `NAME.out`.
    pub fn spawn_on_terminal(&self, name: &str, args: &[&str]) -> Process {
        let pg_fence = self.pg_fence(args);
        let line = std::iter::once(pg_fence.get_program())
            .chain(pg_fence.get_args())
            .map(|word| format!("'{}'", word.to_str().unwrap().replace('\'', "'\\''")))
            .collect::<Vec<_>>()
            .join(" ");
        self.start_on_terminal(name, &line)
    }

    /// Starts the shell command `line` under `script(1)`, on its pseudo-terminal, with pg-fence's
    /// environment, in the scratch directory; what the terminal shows goes to `NAME.out`.
    pub fn start_on_terminal(&self, name: &str, line: &str) -> Process {
        let mut script = Command::new("script");
        script.args(["--quiet", "--return", "--command", line, "/dev/null"]);
        for (name, value) in self.pg_fence(&[]).get_envs() {
            match value {
                Some(value) => script.env(name, value),
                None => script.env_remove(name),
            };
        }
        script.current_dir(self.dir.path()).stdin(Stdio::null());
        self.start(name, script)
    }

    /// Starts `cmd` (made by `pg_fence`, changed as a test needs), its outputs to `NAME.out` and
    /// `NAME.err`.
    pub fn start(&self, name: &str, mut cmd: Command) -> Process {
        let out = std::fs::File::create(self.path(&format!("{name}.out"))).unwrap();
        let err = std::fs::File::create(self.path(&format!("{name}.err"))).unwrap();
        let child = cmd.stdout(out).stderr(err).spawn().unwrap();
        Process { child, dir: self.dir.path().to_owned(), name: name.to_owned() }
    }

    /// `pg-fence ARGS` run to its end: its exit status, stdout and stderr.
    pub fn run(&self, name: &str, args: &[&str]) -> (i32, String, String) {
        let mut process = self.spawn(name, args);
        let code = process.exit_code();
        (code, process.stdout(), process.stderr())
    }

    /// Whether `file` exists in the scratch directory, waiting for it up to LIMIT.
    pub fn appears(&self, file: &str) -> bool {
        eventually(LIMIT, || self.path(file).exists())
    }

    pub fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.path(file)).unwrap_or_default()
    }

    pub fn touch(&self, file: &str) {
        std::fs::write(self.path(file), "").unwrap();
    }

    /// One value from the cluster.
    pub fn query_i64(&self, sql: &str) -> i64 {
        self.cluster.connect().query_one(sql, &[]).unwrap().get(0)
    }

    pub fn execute(&self, sql: &str) {
        self.cluster.connect().batch_execute(sql).unwrap();
    }

    /// The pid of the one backend waiting in fence.await_change (an `observe`, or the watch of a
    /// `run` or `elect`), once there is exactly one.
    pub fn watching_backend(&self) -> u32 {
        let watching = "SELECT pid::bigint FROM pg_stat_activity WHERE query LIKE '%await_change%' \
                        AND pid <> pg_backend_pid() AND backend_type = 'client backend'";
        let counted = format!("SELECT count(*) FROM ({watching}) AS w");
        assert!(eventually(LIMIT, || self.query_i64(&counted) == 1), "no one backend in fence.await_change");
        self.query_i64(watching) as u32
    }
}

/// A running pg-fence; killed when dropped, with the process groups of the commands it started, so
/// that a failing test leaves no process behind.
pub struct Process {
    pub child: Child,
    dir: PathBuf,
    name: String,
}

impl Process {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its exit status, waiting up to LIMIT (a test fails rather than hangs).
    pub fn exit_code(&mut self) -> i32 {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            assert!(
                start.elapsed() < LIMIT,
                "{} still runs after {LIMIT:?}; stderr: {}",
                self.name,
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    pub fn stdout(&self) -> String {
        std::fs::read_to_string(self.dir.join(format!("{}.out", self.name))).unwrap_or_default()
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join(format!("{}.err", self.name))).unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.running() {
            // Each command runs in a group of its own, which killing pg-fence leaves running: its
            // groups are found while pg-fence is still their parent, and it is stopped first so
            // that it starts none meanwhile. The test's own group, which pg-fence shares, is spared.
            let pid = self.pid() as libc::pid_t;
            // SAFETY: kill, getpgrp and killpg only send signals or read the caller's group; a
            // process or group gone meanwhile returns ESRCH, which is harmless here.
            unsafe {
                libc::kill(pid, libc::SIGSTOP);
                let own = libc::getpgrp();
                for group in descendants(self.pid()).into_iter().filter_map(group_of) {
                    if group != own {
                        libc::killpg(group, libc::SIGKILL);
                    }
                }
                libc::kill(pid, libc::SIGKILL);
                libc::kill(pid, libc::SIGCONT);
            }
            self.child.wait().ok();
        }
    }
}

/// The pids of the processes below `pid`, children first (script(1) stands between a test and a
/// pg-fence on a terminal).
fn descendants(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let mut next = vec![pid];
    while let Some(parent) = next.pop() {
        let tasks = std::fs::read_dir(format!("/proc/{parent}/task")).into_iter().flatten().flatten();
        for task in tasks {
            let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in children.split_whitespace().filter_map(|pid| pid.parse().ok()) {
                found.push(child);
                next.push(child);
            }
        }
    }
    found
}

/// The process group of `pid`, None once it is gone.
fn group_of(pid: u32) -> Option<libc::pid_t> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses, so after the last ')'.
    stat.rsplit_once(')')?.1.split_whitespace().nth(2)?.parse().ok()
}

/// A shell command line as `sh -c` runs it, for pg-fence's CMD.
pub fn sh(script: &str) -> [&str; 3] {
    ["sh", "-c", script]
}

/// The pids of the processes whose command line contains `text`.
pub fn pids_running(text: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(cmdline) = std::fs::read(Path::new("/proc").join(pid.to_string()).join("cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&cmdline).contains(text) {
            found.push(pid);
        }
    }
    found
}
