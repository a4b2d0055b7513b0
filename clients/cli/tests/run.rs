//! `pg-fence run` as a real process against a real cluster: one holder at a time, the fence in the
//! command's environment and its writes under it, loss of the lease (revoke, a stopped pg-fence),
//! signals, --at-least, and the documented exit statuses.
mod common;
use common::{sh, Setup, LIMIT};
use std::time::Duration;

/// The guarded write a command makes: a row with its fence, refused (psql exits 1) once stale.
const GUARDED_INSERT: &str =
    "psql -X -q -v ON_ERROR_STOP=1 -c \"INSERT INTO writes SELECT $PG_FENCE_FENCE WHERE fence.fence_guard('$PG_FENCE_KEY', $PG_FENCE_FENCE)\"";

fn with_writes(setup: &Setup) {
    setup.execute("CREATE TABLE writes (fence bigint)");
}

#[test]
fn one_run_holds_the_key_the_others_wait_or_exit_held() {
    let setup = Setup::new("cli_two_runs", 27900);
    with_writes(&setup);
    let first_script = format!("echo $PG_FENCE_FENCE $PG_FENCE_OWNER > first; {GUARDED_INSERT} && touch wrote; while [ ! -e go ]; do sleep 0.05; done");
    let mut first = setup.spawn(
        "first",
        &[&["run", "--owner", "first-host", "job"][..], &["--"], &sh(&first_script)].concat(),
    );
    assert!(setup.appears("wrote"), "the first run's guarded write: {}", first.stderr());
    let fence: i64 = setup.read("first").split_whitespace().next().unwrap().parse().unwrap();
    assert_eq!(setup.read("first").split_whitespace().nth(1), Some("first-host"));
    assert_eq!(
        setup.query_i64("SELECT max(fence) FROM writes"),
        fence,
        "the write is under the fence the command saw"
    );
    assert!(!setup.read("first").contains("PG_FENCE_TOKEN"));

    let (code, _, stderr) = setup.run("held", &["run", "--no-wait", "job", "--", "true"]);
    assert_eq!(code, 75, "--no-wait on a held key: {stderr}");
    assert!(stderr.contains("job is held by first-host since"), "{stderr}");

    let mut waiting = setup.spawn(
        "second",
        &[&["run", "--wait", "1m", "job", "--"][..], &sh("echo $PG_FENCE_FENCE > second")].concat(),
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        waiting.running() && !setup.path("second").exists(),
        "the second run waits while the first holds the key"
    );
    setup.touch("go");
    assert_eq!(first.exit_code(), 0, "{}", first.stderr());
    assert_eq!(waiting.exit_code(), 0, "{}", waiting.stderr());
    let second: i64 = setup.read("second").trim().parse().unwrap();
    assert!(second > fence, "the next holder's fence {second} is above {fence}");
    assert_eq!(
        setup.query_i64("SELECT count(*) FROM fence.leases WHERE key = 'job' AND live"),
        0,
        "released at the end"
    );

    let (code, stdout, _) = setup
        .run("token", &["run", "--export-token", "job", "--", "sh", "-c", "echo ${PG_FENCE_TOKEN:-none}"]);
    assert_eq!(code, 0);
    assert_eq!(stdout.trim().len(), 36, "a uuid: {stdout}");
    let (code, _, _) = setup.run("status", &["run", "job", "--", "sh", "-c", "exit 7"]);
    assert_eq!(code, 7, "the command's own status");
}

#[test]
fn a_revoke_stops_the_command_with_sigterm_then_sigkill() {
    let setup = Setup::new("cli_revoke", 27901);
    // A command that stops on SIGTERM.
    let script = "trap 'echo TERM > stopped; exit 3' TERM; touch started; while :; do sleep 0.05; done";
    let mut polite =
        setup.spawn("polite", &[&["run", "--kill-after", "30s", "job", "--"][..], &sh(script)].concat());
    assert!(setup.appears("started"));
    let (code, stdout, _) = setup.run("revoke", &["revoke", "job"]);
    assert_eq!((code, stdout.trim()), (0, "revoked the live lease on job"));
    assert_eq!(polite.exit_code(), 76, "lease lost while running");
    assert_eq!(setup.read("stopped").trim(), "TERM");
    let stderr = polite.stderr();
    assert!(stderr.contains("the lease on job was lost (revoked): sending SIGTERM"), "{stderr}");
    assert!(!stderr.contains("SIGKILL"), "{stderr}");

    // A command that ignores SIGTERM (and so does the sleep it starts): SIGKILL, to its whole group.
    // The test's pid marks this run's shell, which no other run's (a leftover of a failed one) has.
    let marker = format!("stubborn-{}", std::process::id());
    let script = format!("trap '' TERM; touch started2; : {marker}; while :; do sleep 0.05; done");
    let mut stubborn =
        setup.spawn("stubborn", &[&["run", "--kill-after", "1s", "job", "--"][..], &sh(&script)].concat());
    assert!(setup.appears("started2"));
    assert_eq!(setup.run("revoke2", &["revoke", "job"]).0, 0);
    assert_eq!(stubborn.exit_code(), 76);
    let stderr = stubborn.stderr();
    assert!(
        stderr.contains("sending SIGTERM") && stderr.contains("after SIGTERM: sending SIGKILL"),
        "{stderr}"
    );
    assert!(common::eventually(LIMIT, || common::pids_running(&marker).is_empty()), "the group is gone");
    assert_eq!(setup.run("revoke3", &["revoke", "job"]).0, 1, "nothing left to revoke");
}

#[test]
fn signals_to_pg_fence_go_to_the_command() {
    let setup = Setup::new("cli_signals", 27902);
    let script = "trap 'echo HUP >> got' HUP; trap 'echo TERM >> got; exit 5' TERM; touch started; while :; do sleep 0.05; done";
    let mut run = setup.spawn("run", &[&["run", "job", "--"][..], &sh(script)].concat());
    assert!(setup.appears("started"));
    common::signal(run.pid(), "-HUP");
    assert!(common::eventually(LIMIT, || setup.read("got").contains("HUP")));
    common::signal(run.pid(), "-TERM");
    assert_eq!(run.exit_code(), 5, "the command's own status after the forwarded SIGTERM");
    assert_eq!(setup.read("got"), "HUP\nTERM\n");
    assert_eq!(
        setup.query_i64("SELECT count(*) FROM fence.leases WHERE key = 'job' AND live"),
        0,
        "released"
    );
}

#[test]
fn at_least_leaves_the_lease_to_expire_that_long_after_the_grant() {
    let setup = Setup::new("cli_at_least", 27903);
    let (code, _, stderr) = setup.run("short", &["run", "--at-least", "3s", "job", "--", "true"]);
    assert_eq!(code, 0, "{stderr}");
    let held_for = setup.query_i64("SELECT extract(epoch FROM (expires_at - acquired_at) * 1000)::bigint FROM fence.leases WHERE key = 'job'");
    assert!((2990..=3010).contains(&held_for), "expires 3 s after the grant, not at its ttl: {held_for} ms");
    assert_eq!(
        setup.run("again", &["run", "--no-wait", "job", "--", "true"]).0,
        75,
        "still held after the command ended"
    );
    assert!(
        common::eventually(LIMIT, || setup.run("later", &["run", "--no-wait", "job", "--", "true"]).0 == 0)
    );
    // A command that outlives --at-least: released at its end as usual.
    assert_eq!(setup.run("long", &["run", "--at-least", "100ms", "job", "--", "sleep", "0.5"]).0, 0);
    assert_eq!(setup.query_i64("SELECT count(*) FROM fence.leases WHERE key = 'job' AND live"), 0);
}

#[test]
fn a_stopped_pg_fence_leaves_its_command_running_and_its_writes_are_refused() {
    let setup = Setup::new("cli_sigstop", 27904);
    with_writes(&setup);
    // Writes every 100 ms, and says which were accepted and which refused.
    let script = format!("while :; do if {GUARDED_INSERT} 2>/dev/null; then echo ok >> log; else echo refused >> log; fi; sleep 0.1; done");
    let mut stopped =
        setup.spawn("stopped", &[&["run", "--ttl", "2s", "job", "--"][..], &sh(&script)].concat());
    assert!(common::eventually(LIMIT, || setup.read("log").contains("ok")));
    common::signal(stopped.pid(), "-STOP");
    let (code, _, stderr) =
        setup.run("taker", &["run", "--wait", "1m", "job", "--", "sh", "-c", "echo $PG_FENCE_FENCE"]);
    assert_eq!(code, 0, "the key is taken over once the stopped holder's ttl ran out: {stderr}");
    let lines = setup.read("log").lines().count();
    assert!(
        common::eventually(LIMIT, || setup.read("log").lines().skip(lines).any(|line| line == "refused")),
        "the command runs on, refused"
    );
    assert!(
        !setup.read("log").lines().skip(lines).any(|line| line == "ok"),
        "no write accepted after the takeover"
    );
    common::signal(stopped.pid(), "-CONT");
    assert_eq!(stopped.exit_code(), 76);
    assert!(stopped.stderr().contains("sending SIGTERM"), "{}", stopped.stderr());
}

#[test]
fn usage_and_an_unreachable_server_have_their_own_statuses() {
    let setup = Setup::new("cli_statuses", 27905);
    assert_eq!(setup.run("usage", &["run", "job"]).0, 64, "no command");
    assert_eq!(setup.run("usage2", &["run", "--no-wait", "--wait", "1s", "job", "--", "true"]).0, 64);
    assert_eq!(setup.run("help", &["run", "--help"]).0, 0);
    assert_eq!(setup.run("missing", &["run", "job", "--", "/nonexistent"]).0, 127);
    let mut down = setup.pg_fence(&["--retry-for", "500ms", "run", "job", "--", "true"]);
    let output = down.env("PGPORT", "27949").output().unwrap();
    assert_eq!(output.status.code(), Some(69), "{}", String::from_utf8_lossy(&output.stderr));
}

#[test]
fn a_server_crash_shorter_than_the_ttl_leaves_the_command_running_and_its_lease_renewed() {
    let setup = Setup::new("cli_crash_kept", 27906);
    with_writes(&setup);
    let script = format!("trap 'echo TERM > got' TERM; echo $PG_FENCE_FENCE > fence.tmp; mv fence.tmp fence; while [ ! -e go ]; do sleep 0.05; done; {GUARDED_INSERT}");
    let mut run = setup.spawn("run", &[&["run", "--ttl", "10s", "job", "--"][..], &sh(&script)].concat());
    // Renamed into place, so that it is never seen empty.
    assert!(setup.appears("fence"));
    let fence: i64 = setup.read("fence").trim().parse().unwrap();
    setup.cluster.crash();
    setup.cluster.restart();
    let restarted = setup.query_i64("SELECT (extract(epoch FROM clock_timestamp()) * 1e6)::bigint");
    // A renewal after the restart moves the expiry to a TTL after an instant past the restart.
    let renewed = format!(
        "SELECT count(*) FROM fence.leases WHERE key = 'job' AND live AND fence = {fence} \
         AND extract(epoch FROM expires_at - interval '10 s') * 1e6 >= {restarted}"
    );
    assert!(common::eventually(LIMIT, || setup.query_i64(&renewed) == 1), "renewed: {}", run.stderr());
    assert!(run.running() && !setup.path("got").exists(), "the command runs on: {}", run.stderr());
    setup.touch("go");
    assert_eq!(run.exit_code(), 0, "the command's guarded write after the restart: {}", run.stderr());
    assert_eq!(setup.query_i64("SELECT max(fence) FROM writes"), fence);
    assert_eq!(setup.query_i64("SELECT count(*) FROM fence.leases WHERE key = 'job' AND live"), 0);
}

#[test]
fn a_server_down_longer_than_the_ttl_stops_the_command_before_the_lease_expires() {
    let setup = Setup::new("cli_crash_lost", 27907);
    // bash's $EPOCHREALTIME, not date: the instant the trap runs, without a process to start.
    let script =
        "trap 'echo $EPOCHREALTIME > term; exit 3' TERM; touch started; while :; do sleep 0.05; done";
    let mut run =
        setup.spawn("run", &["run", "--ttl", "5s", "--kill-after", "30s", "job", "--", "bash", "-c", script]);
    assert!(setup.appears("started"));
    setup.cluster.crash();
    assert_eq!(run.exit_code(), 76, "lease lost while running: {}", run.stderr());
    assert!(
        run.stderr().contains("no answer from the server before the local deadline of the lease on job (unreachable): sending SIGTERM to the command"),
        "{}",
        run.stderr()
    );
    setup.cluster.restart();
    // The grant and each renewal of a durable lease are flushed before they answer: the crash kept
    // the expiry of the last renewal pg-fence heard of (or of a later one it sent).
    let expires_at = setup.query_i64(
        "SELECT (extract(epoch FROM expires_at) * 1e6)::bigint FROM fence.leases WHERE key = 'job'",
    );
    let term = setup.read("term").trim().replace('.', "").parse::<i64>().unwrap();
    assert!(term < expires_at, "SIGTERM {} ms before the server's expiry", (expires_at - term) / 1000);
}

#[test]
fn shared_runs_hold_the_key_side_by_side_and_permits_bound_the_runs() {
    let setup = Setup::new("cli_shared", 27908);
    // The second starts while the first holds the key.
    let mut shared_one = setup.hold_until("shared_one", &["--shared", "job"], "one", "go");
    let mut shared_two = setup.hold_until("shared_two", &["--shared", "job"], "two", "go");
    assert_eq!(setup.query_i64("SELECT count(*) FROM fence.leases WHERE key = 'job' AND live AND shared"), 2);
    assert_eq!(setup.run("exclusive_now", &["run", "--no-wait", "job", "--", "true"]).0, 75);
    let mut exclusive =
        setup.spawn("exclusive", &["run", "--wait", "1m", "job", "--", "touch", "exclusive_ran"]);
    std::thread::sleep(Duration::from_millis(500));
    assert!(exclusive.running() && !setup.path("exclusive_ran").exists(), "an exclusive run waits");
    setup.touch("go");
    assert_eq!((shared_one.exit_code(), shared_two.exit_code()), (0, 0));
    assert_eq!(exclusive.exit_code(), 0, "{}", exclusive.stderr());
    assert!(setup.path("exclusive_ran").exists());

    // Two permits: two runs at once, a third waits for one of them.
    let mut first = setup.hold_until("first", &["--permits", "2", "pool"], "first", "go_first");
    let mut second = setup.hold_until("second", &["--permits", "2", "pool"], "second", "go_second");
    let (code, _, stderr) =
        setup.run("third_now", &["run", "--no-wait", "--permits", "2", "pool", "--", "true"]);
    assert_eq!(code, 75, "a third permit: {stderr}");
    let mut third = setup.spawn("third", &["run", "--permits", "2", "pool", "--", "touch", "third"]);
    std::thread::sleep(Duration::from_millis(500));
    assert!(third.running() && !setup.path("third").exists(), "the third run waits");
    setup.touch("go_first");
    assert_eq!(first.exit_code(), 0);
    assert_eq!(third.exit_code(), 0, "the third runs once a permit is free: {}", third.stderr());
    assert!(second.running(), "beside the second");
    setup.touch("go_second");
    assert_eq!(second.exit_code(), 0);
}

#[test]
fn the_wait_shows_who_holds_the_key_when_stderr_is_a_terminal() {
    let setup = Setup::new("cli_terminal", 27909);
    let mut holder = setup.hold_until("holder", &["--owner", "first-host", "job"], "started", "go");
    let mut shown = setup.spawn_on_terminal("shown", &["run", "--wait", "1m", "job", "--", "echo", "ran"]);
    let mut hidden = setup.spawn("hidden", &["run", "--wait", "1m", "job", "--", "true"]);
    assert!(
        common::eventually(LIMIT, || shown
            .stdout()
            .contains("pg-fence: waiting for job, held by first-host since ")),
        "{}",
        shown.stdout()
    );
    setup.touch("go");
    assert_eq!(holder.exit_code(), 0);
    assert_eq!(shown.exit_code(), 0, "{}", shown.stdout());
    assert!(shown.stdout().contains("ran"), "{}", shown.stdout());
    assert_eq!(hidden.exit_code(), 0);
    assert!(!hidden.stderr().contains("waiting"), "not on a file: {}", hidden.stderr());
}
