//! The connection's failures, on ports 27932-27938: a server that never answers (a listener that
//! accepts nothing, a stopped cluster), a restart while waiting, a refused login, input the
//! server would refuse.
mod common;
use common::{sh, Frozen, Setup, LIMIT};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `pg-fence ARGS` against 127.0.0.1:`port`, with `env` set and no other connection settings.
fn pg_fence_at(port: u16, env: &[(&str, &str)], args: &[&str]) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pg-fence"));
    cmd.args(args)
        .env("PGHOST", "127.0.0.1")
        .env("PGPORT", port.to_string())
        .env("PGUSER", "postgres")
        .env("PGDATABASE", "postgres")
        .env_remove("PGCONNECT_TIMEOUT")
        .env_remove("PGSERVICE")
        .env_remove("PGSSLMODE")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd.spawn().unwrap()
}

/// Its exit status and stderr if it ends within `limit`; else it is killed, and None.
fn ended_within(mut child: Child, limit: Duration) -> (Option<i32>, String) {
    let start = Instant::now();
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if start.elapsed() > limit {
            child.kill().ok();
            child.wait().ok();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).ok();
    (code, stderr)
}

const SUBCOMMANDS: [&[&str]; 7] = [
    &["run", "--no-wait", "job", "--", "true"],
    &["run", "--wait", "10m", "job", "--", "true"],
    &["elect", "sched", "--", "true"],
    &["status", "job"],
    &["leases"],
    &["stats"],
    &["revoke", "job"],
];

#[test]
fn every_subcommand_gives_up_on_a_server_that_accepts_and_never_answers() {
    // Never accepted: the kernel completes each handshake, and nothing ever answers (as a proxy
    // that stopped forwarding).
    let _silent = std::net::TcpListener::bind("127.0.0.1:27932").unwrap();
    let timeout = [("PGCONNECT_TIMEOUT", "3")];
    let started: Vec<_> = SUBCOMMANDS
        .iter()
        .map(|args| (args, pg_fence_at(27932, &timeout, &[&["--retry-for", "3s"][..], args].concat())))
        .collect();
    // Nothing given: the default limit, so that a cron line never hangs.
    let default = pg_fence_at(27932, &[], &["--retry-for", "0s", "run", "--no-wait", "job", "--", "true"]);
    for (args, child) in started {
        // 3 s a try, a retry within 3 s of the first failure: a generous bound for a loaded machine.
        let (code, stderr) = ended_within(child, Duration::from_secs(40));
        assert_eq!(code, Some(69), "{args:?}: {stderr}");
        assert!(
            stderr.contains(r#"connection to server at "127.0.0.1", port 27932 failed: timeout expired"#),
            "{args:?}: {stderr}"
        );
    }
    let (code, stderr) = ended_within(default, LIMIT);
    assert_eq!(code, Some(69), "without PGCONNECT_TIMEOUT: {stderr}");
}

#[test]
fn a_stopped_server_fails_a_call_in_progress_and_a_new_one() {
    let setup = Setup::new("cli_frozen", 27933);
    let bounded = ["--dsn", "connect_timeout=3", "--retry-for", "3s"];
    let mut watch =
        setup.spawn("watch", &[&bounded[..], &["leases", "--watch", "--interval", "200ms"]].concat());
    assert!(common::eventually(LIMIT, || watch.stdout().contains("(none)")), "{}", watch.stderr());
    let frozen = Frozen::server(&setup.cluster);
    let mut status = setup.spawn("status", &[&bounded[..], &["status", "job"]].concat());
    // Each within LIMIT, or the test fails.
    assert_eq!(watch.exit_code(), 69, "leases --watch, the server stopped mid-watch: {}", watch.stderr());
    assert_eq!(status.exit_code(), 69, "status: {}", status.stderr());
    let port = setup.cluster.port();
    let named = format!(r#"connection to server at "127.0.0.1", port {port} failed: timeout expired"#);
    assert!(status.stderr().contains(&named), "{}", status.stderr());
    drop(frozen);
}

/// A candidate `hold` (its command runs until `go` exists) holds the key; `wait` (ARGS, with
/// `--retry-for 8s`, its command touching `ran`) waits for it, longer than its --retry-for, when
/// the server restarts. The waiter must wait on, and run its command once the holder ends.
fn a_waiter_outlasts_a_restart(setup: &Setup, hold: &[&str], wait: &[&str]) {
    let script = "touch started; while [ ! -e go ]; do sleep 0.05; done";
    let mut holder = setup.spawn("holder", &[hold, &["--"], &sh(script)].concat());
    assert!(setup.appears("started"), "{}", holder.stderr());
    let mut waiter = setup.spawn("waiter", &[&["--retry-for", "8s"], wait, &["--", "touch", "ran"]].concat());
    let waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Extension'";
    assert!(common::eventually(LIMIT, || setup.query_i64(waiting) == 1), "{}", waiter.stderr());
    // Longer than --retry-for, which must count from the failure, not from the start of the wait.
    std::thread::sleep(Duration::from_secs(10));
    setup.cluster.stop("fast");
    setup.cluster.restart();
    setup.touch("go");
    assert_eq!(holder.exit_code(), 0, "{}", holder.stderr());
    assert_eq!(waiter.exit_code(), 0, "the waiter gave up on the restart: {}", waiter.stderr());
    assert!(setup.path("ran").exists());
}

#[test]
fn run_waiting_longer_than_retry_for_outlasts_a_restart() {
    let setup = Setup::new("cli_wait_restart", 27934);
    a_waiter_outlasts_a_restart(&setup, &["run", "job"], &["run", "--wait", "10m", "job"]);
}

#[test]
fn elect_waiting_longer_than_retry_for_outlasts_a_restart() {
    let setup = Setup::new("cli_elect_restart", 27935);
    a_waiter_outlasts_a_restart(
        &setup,
        &["elect", "sched", "--value", "one"],
        &["elect", "sched", "--value", "two"],
    );
}

#[test]
fn status_leases_stats_and_revoke_retry_for_retry_for() {
    let setup = Setup::new("cli_admin_retry", 27936);
    setup.cluster.stop("fast");
    let asked: [&[&str]; 4] = [&["status", "job"], &["leases"], &["stats"], &["revoke", "job"]];
    let mut running: Vec<_> =
        asked.iter().map(|args| setup.spawn(args[0], &[&["--retry-for", "5m"][..], args].concat())).collect();
    // A refused connection fails at once: each has failed by now, many times.
    std::thread::sleep(Duration::from_secs(2));
    for (args, process) in asked.iter().zip(&mut running) {
        assert!(process.running(), "{args:?} gave up within its --retry-for: {}", process.stderr());
    }
    setup.cluster.restart();
    let codes: Vec<i32> = running.iter_mut().map(|process| process.exit_code()).collect();
    assert_eq!(codes, [1, 0, 0, 1], "not held, listed, shown, nothing to revoke");
}

#[test]
fn a_refused_login_is_a_configuration_error_said_once_and_not_retried() {
    let setup = Setup::new("cli_refused_login", 27937);
    setup.execute("CREATE ROLE pw LOGIN PASSWORD 'right'");
    let hba = setup.cluster.log_path().with_file_name("pg_hba.conf");
    let rules = std::fs::read_to_string(&hba).unwrap();
    std::fs::write(&hba, format!("host all pw 127.0.0.1/32 scram-sha-256\n{rules}")).unwrap();
    setup.execute("SELECT pg_reload_conf()");
    let port = setup.cluster.port();
    let attempts = || {
        let log = std::fs::read_to_string(setup.cluster.log_path()).unwrap_or_default();
        log.matches(r#"password authentication failed for user "pw""#).count()
    };
    let wrong = [("PGUSER", "pw"), ("PGPASSWORD", "wrong")];
    for args in [&["status", "job"][..], &["run", "--no-wait", "job", "--", "true"]] {
        let before = attempts();
        let child = pg_fence_at(port, &wrong, &[&["--retry-for", "30s"][..], args].concat());
        let (code, stderr) = ended_within(child, LIMIT);
        assert_eq!(code, Some(78), "{args:?}: {stderr}");
        assert!(stderr.contains("password authentication failed"), "{args:?}: {stderr}");
        assert!(stderr.contains(&format!(r#"at "127.0.0.1", port {port}"#)), "{stderr}");
        assert_eq!(attempts() - before, 1, "{args:?}: one login, not retried");
    }
    for (env, what) in [(("PGUSER", "nobody"), "role"), (("PGDATABASE", "nowhere"), "database")] {
        let child = pg_fence_at(port, &[env], &["--retry-for", "30s", "stats"]);
        let (code, stderr) = ended_within(child, LIMIT);
        assert_eq!(code, Some(78), "{what}: {stderr}");
    }
}

#[test]
fn input_the_server_would_refuse_is_bad_usage_before_connecting() {
    let long = "k".repeat(513);
    let owner = "o".repeat(257);
    let refused: [&[&str]; 7] = [
        &["run", "", "--", "true"],
        &["run", &long, "--", "true"],
        &["run", "--permits", "10001", "job", "--", "true"],
        &["run", "--ttl", "0", "job", "--", "true"],
        &["run", "--owner", &owner, "job", "--", "true"],
        &["elect", "", "--", "true"],
        &["status", &long],
    ];
    // 27949: nothing listens, and nothing must be tried.
    for args in refused {
        let (code, stderr) = ended_within(pg_fence_at(27949, &[], args), LIMIT);
        assert_eq!(code, Some(64), "{args:?}: {stderr}");
        assert!(!stderr.contains("connect"), "{args:?}: {stderr}");
    }
    for option in ["--ttl", "--wait", "--at-least", "--kill-after", "--retry-for"] {
        let (code, stderr) =
            ended_within(pg_fence_at(27949, &[], &["run", option, "-1s", "job", "--", "true"]), LIMIT);
        assert_eq!(code, Some(64), "{option} -1s: {stderr}");
        assert!(stderr.contains("a duration cannot be negative"), "{option} -1s: {stderr}");
    }
}

#[test]
fn a_ttl_above_the_servers_max_ttl_is_bad_usage() {
    let cluster = common::Cluster::start("cli_max_ttl", 27938, &["fsync=off", "pg_fence.max_ttl=1h"]);
    let setup = Setup { cluster, dir: common::ScratchDir::create("cli_max_ttl_files") };
    let (code, _, stderr) = setup.run("run", &["run", "--ttl", "2h", "job", "--", "true"]);
    assert_eq!(code, 64, "{stderr}");
    assert!(stderr.contains("max_ttl"), "{stderr}");
}
