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
    let stderr = stopped.stderr();
    assert!(stderr.contains("sending SIGTERM"), "{stderr}");
    assert!(
        stderr.contains("pg-fence itself did not run for") && !stderr.contains("unreachable"),
        "the stop is named, not the server: {stderr}"
    );
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

#[test]
fn an_at_least_longer_than_the_servers_max_ttl_is_refused_before_the_command_runs() {
    let setup = Setup::new("cli_at_least_max", 27921);
    let (code, _, stderr) = setup.run("long", &["run", "--at-least", "25h", "weekly", "--", "touch", "ran"]);
    assert_eq!(code, 64, "{stderr}");
    assert!(!setup.path("ran").exists(), "the command did not run: {stderr}");
    assert!(
        stderr.contains("--at-least 1day 1h is longer than the server's pg_fence.max_ttl (1day)")
            && stderr.contains("HINT: raise pg_fence.max_ttl"),
        "{stderr}"
    );
    assert_eq!(setup.query_i64("SELECT count(*) FROM fence.leases WHERE key = 'weekly' AND live"), 0);
    let mut admin = setup.cluster.connect();
    // The setting is known to a session once it has loaded the library.
    admin.batch_execute("LOAD 'pg_fence'").unwrap();
    admin.batch_execute("ALTER SYSTEM SET pg_fence.max_ttl = '8d'").unwrap();
    admin.batch_execute("SELECT pg_reload_conf()").unwrap();
    assert!(
        common::eventually(LIMIT, || setup
            .run("week", &["run", "--at-least", "7d", "weekly", "--", "touch", "ran"])
            .0
            == 0),
        "a week once max_ttl allows it"
    );
    let held_for = setup.query_i64(
        "SELECT extract(epoch FROM expires_at - acquired_at)::bigint FROM fence.leases WHERE key = 'weekly' AND live",
    );
    assert_eq!(held_for, 7 * 24 * 3600, "kept the whole week");
}

/// Kills what is left of a test's commands (marked by `marker`), and says how many there were.
fn kill_left(marker: &str) -> usize {
    let left = common::pids_running(marker);
    for pid in &left {
        // SAFETY: only sends a signal to a process of this test's own.
        unsafe { libc::kill(*pid as libc::pid_t, libc::SIGKILL) };
    }
    left.len()
}

#[test]
fn pg_fence_killed_takes_the_whole_command_with_it() {
    let setup = Setup::new("cli_sigkill", 27922);
    // A shell and a worker it started, both deaf to SIGTERM; the marker is in both command lines.
    let marker = format!("orphaned-{}", std::process::id());
    let script = format!(
        "trap '' TERM; : {marker}; (while :; do sleep 0.05; done) & touch started; while :; do sleep 0.05; done"
    );
    let mut run =
        setup.spawn("run", &[&["run", "--kill-after", "1s", "job", "--"][..], &sh(&script)].concat());
    assert!(setup.appears("started"), "{}", run.stderr());
    // pg-fence's own command line holds the script too.
    assert!(common::pids_running(&marker).len() >= 3, "pg-fence, the shell and its worker");
    common::signal(run.pid(), "-KILL");
    run.exit_code();
    let gone = common::eventually(LIMIT, || common::pids_running(&marker).is_empty());
    let left = kill_left(&marker);
    assert!(gone, "{left} of the command's processes still ran after pg-fence was killed");
    assert!(run.stderr().contains("after SIGTERM: sending SIGKILL"), "{}", run.stderr());
}

/// After pg-fence was killed: the command that names `marker`, stamping `ticks` with the time, is
/// gone, and stamped its last before the server's expiry of the lease on `job`.
fn ended_before_the_lease(setup: &Setup, marker: &str) {
    let gone = common::eventually(LIMIT, || common::pids_running(marker).is_empty());
    let left = kill_left(marker);
    assert!(gone, "{left} of the command's processes still ran {LIMIT:?} after pg-fence was killed");
    let expires_at = setup.query_i64(
        "SELECT (extract(epoch FROM expires_at) * 1e6)::bigint FROM fence.leases WHERE key = 'job'",
    );
    let last = setup.read("ticks").lines().last().unwrap().replace('.', "").parse::<i64>().unwrap();
    assert!(last < expires_at, "the last tick {} ms after the server's expiry", (last - expires_at) / 1000);
}

#[test]
fn pg_fence_killed_as_its_command_starts_leaves_it_no_time_past_the_lease() {
    use std::os::unix::process::CommandExt;
    let setup = Setup::new("cli_killed_at_start", 27981);
    let marker = format!("killed-at-start-{}", std::process::id());
    // Deaf to SIGTERM, its first act kills pg-fence's whole group (pg-fence in a group of its own,
    // as under timeout(1)): pg-fence has done nothing since it started it. On a busy machine that
    // happens when other processes have the CPU. Here pg-fence runs on one CPU in real time
    // (SCHED_FIFO), and so does the command, which inherits it: pg-fence, woken by the command's
    // exec, waits for the CPU until the command blocks, and the command raises its priority above
    // pg-fence's before its first act.
    let realtime = std::process::Command::new("chrt").args(["-f", "2", "true"]).status().unwrap();
    assert!(realtime.success(), "this test needs real-time scheduling (chrt -f): CAP_SYS_NICE");
    let script = format!(
        "trap '' TERM; : {marker}; kill -KILL -- -$PPID; touch started; while :; do echo $EPOCHREALTIME >> ticks; sleep 0.05; done"
    );
    let args =
        ["run", "--ttl", "6s", "--kill-after", "1h", "job", "--", "chrt", "-f", "2", "bash", "-c", &script];
    let mut cmd = setup.pg_fence(&args);
    cmd.process_group(0);
    // SAFETY: between fork and exec, only calls on local sets and on this process's scheduling.
    unsafe {
        cmd.pre_exec(|| {
            let size = std::mem::size_of::<libc::cpu_set_t>();
            let (mut allowed, mut one): (libc::cpu_set_t, libc::cpu_set_t) =
                (std::mem::zeroed(), std::mem::zeroed());
            if libc::sched_getaffinity(0, size, &mut allowed) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let first =
                (0..libc::CPU_SETSIZE as usize).find(|&cpu| libc::CPU_ISSET(cpu, &allowed)).unwrap_or(0);
            libc::CPU_SET(first, &mut one);
            let priority = libc::sched_param { sched_priority: 1 };
            if libc::sched_setaffinity(0, size, &one) != 0
                || libc::sched_setscheduler(0, libc::SCHED_FIFO, &priority) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut run = setup.start("run", cmd);
    assert!(setup.appears("started"), "{}", run.stderr());
    run.exit_code();
    ended_before_the_lease(&setup, &marker);
}

#[test]
fn a_sigterm_the_command_ignores_is_followed_by_sigkill() {
    let setup = Setup::new("cli_term_escalates", 27923);
    let marker = format!("deaf-{}", std::process::id());
    let script = format!("trap '' TERM; : {marker}; touch started; while :; do sleep 0.05; done");
    let mut run =
        setup.spawn("run", &[&["run", "--kill-after", "1s", "job", "--"][..], &sh(&script)].concat());
    assert!(setup.appears("started"), "{}", run.stderr());
    common::signal(run.pid(), "-TERM");
    let start = std::time::Instant::now();
    let ended = loop {
        if !run.running() || start.elapsed() > LIMIT {
            break !run.running();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let left = kill_left(&marker);
    assert!(ended, "pg-fence still ran {LIMIT:?} after SIGTERM ({left} processes of its command left)");
    assert_eq!(run.exit_code(), 137, "the command's status: killed: {}", run.stderr());
    assert!(
        run.stderr().contains("the command still ran 1s after SIGTERM: sending SIGKILL"),
        "{}",
        run.stderr()
    );
    assert_eq!(
        setup.query_i64("SELECT count(*) FROM fence.leases WHERE key = 'job' AND live"),
        0,
        "released"
    );
}

#[test]
fn with_the_server_unreachable_the_command_is_killed_before_the_lease_expires_whatever_kill_after() {
    let setup = Setup::new("cli_kill_before_expiry", 27924);
    // Deaf to SIGTERM, it stamps the time every 50 ms until it is killed.
    let script = "trap '' TERM; touch started; while :; do echo $EPOCHREALTIME >> ticks; sleep 0.05; done";
    let mut run =
        setup.spawn("run", &["run", "--ttl", "20s", "--kill-after", "1h", "job", "--", "bash", "-c", script]);
    assert!(setup.appears("started"));
    setup.cluster.crash();
    let start = std::time::Instant::now();
    while run.running() && start.elapsed() < 2 * LIMIT {
        std::thread::sleep(Duration::from_millis(50));
    }
    let stopped = !run.running();
    if !stopped {
        kill_left("EPOCHREALTIME >> ticks");
    }
    assert!(stopped, "the command still ran {:?} after the crash: {}", 2 * LIMIT, run.stderr());
    assert_eq!(run.exit_code(), 76, "{}", run.stderr());
    setup.cluster.restart();
    let expires_at = setup.query_i64(
        "SELECT (extract(epoch FROM expires_at) * 1e6)::bigint FROM fence.leases WHERE key = 'job'",
    );
    let last = setup.read("ticks").lines().last().unwrap().replace('.', "").parse::<i64>().unwrap();
    assert!(last < expires_at, "the last tick {} ms after the server's expiry", (last - expires_at) / 1000);
    assert!(run.stderr().contains("after SIGTERM: sending SIGKILL"), "{}", run.stderr());
}

#[test]
fn lock_delay_keeps_the_key_from_others_after_a_revocation() {
    let setup = Setup::new("cli_lock_delay", 27925);
    let mut holder = setup.hold_until("holder", &["--lock-delay", "1h", "job"], "started", "go");
    assert_eq!(setup.run("revoke", &["revoke", "job"]).0, 0);
    assert_eq!(holder.exit_code(), 76, "{}", holder.stderr());
    let (code, _, stderr) = setup.run("next", &["run", "--no-wait", "job", "--", "true"]);
    assert_eq!(code, 75, "held back by the lock-delay: {stderr}");
    // A second revocation lifts the lock-delay.
    setup.run("lift", &["revoke", "job"]);
    assert_eq!(setup.run("after", &["run", "--no-wait", "job", "--", "true"]).0, 0);
}

/// The lines of `text` from the one that starts with `start`, up to the next empty line or fence.
fn example(text: &str, start: &str) -> String {
    let lines: Vec<_> = text.lines().collect();
    let first = lines.iter().position(|line| line.trim_start().starts_with(start)).expect(start);
    let rest = lines[first..].iter().take_while(|line| !line.trim().is_empty() && !line.starts_with("```"));
    rest.map(|line| line.trim()).collect::<Vec<_>>().join("\n")
}

#[test]
fn the_fenced_write_of_run_help_is_the_readmes_and_works() {
    let setup = Setup::new("cli_help_example", 27926);
    setup.execute("CREATE TABLE jobs (id int, state int); INSERT INTO jobs VALUES (42, 1)");
    let help = setup.pg_fence(&["run", "--help"]).output().unwrap();
    let help = example(&String::from_utf8(help.stdout).unwrap(), "pg-fence run job:42");
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    assert_eq!(help, example(&readme, "pg-fence run job:42"), "the help's example is the README's");
    // Run as a shell runs it, with the pg-fence just built first on the PATH.
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_pg-fence")).parent().unwrap().to_owned();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let env = setup.pg_fence(&[]);
    let shell = std::process::Command::new("sh")
        .args(["-c", &help])
        .envs(env.get_envs().filter_map(|(name, value)| Some((name.to_owned(), value?.to_owned()))))
        .env("PATH", path)
        .current_dir(setup.dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&shell.stderr);
    assert_eq!(shell.status.code(), Some(0), "{help}\n{stderr}");
    assert_eq!(setup.query_i64("SELECT state::bigint FROM jobs WHERE id = 42"), 2, "{stderr}");
}

#[test]
fn quiet_says_nothing_when_the_key_is_held() {
    let setup = Setup::new("cli_quiet", 27927);
    let mut holder = setup.hold_until("holder", &["job"], "started", "go");
    let (code, _, stderr) = setup.run("loser", &["run", "--no-wait", "--quiet", "job", "--", "true"]);
    assert_eq!((code, stderr.as_str()), (75, ""), "held, said nothing");
    let (code, _, stderr) = setup.run("loud", &["run", "--no-wait", "job", "--", "true"]);
    assert!(code == 75 && stderr.contains("job is held by"), "without --quiet: {stderr}");
    setup.touch("go");
    assert_eq!(holder.exit_code(), 0);
}

/// State, parent, process group and its terminal's foreground group of `pid` from /proc (None
/// once it is gone).
fn stat_of(pid: u32) -> Option<(char, u32, i32, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    Some((state, fields.get(1)?.parse().ok()?, fields.get(2)?.parse().ok()?, fields.get(5)?.parse().ok()?))
}

/// Among the processes that name `marker`: pg-fence (the one of its binary whose parent is not:
/// that one is its watchdog), the command's shell (pg-fence's child), and the shell's process group.
fn pg_fence_and_command(marker: &str) -> (u32, u32, i32) {
    let pids = common::pids_running(marker);
    let binary = env!("CARGO_BIN_EXE_pg-fence");
    let cmdline = |pid: &u32| std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let ours: Vec<u32> =
        pids.iter().copied().filter(|pid| cmdline(pid).starts_with(binary.as_bytes())).collect();
    let pg_fence = *ours.iter().find(|pid| !ours.contains(&stat_of(**pid).unwrap().1)).unwrap();
    let shell =
        *pids.iter().find(|pid| !ours.contains(pid) && stat_of(**pid).unwrap().1 == pg_fence).unwrap();
    (pg_fence, shell, stat_of(shell).unwrap().2)
}

/// A shell with job control (bash, `set -m`) on the terminal of script(1), running `job`: pg-fence
/// in front, as a user's interactive shell runs it, stopped by the terminal's Ctrl-Z, continued by
/// `fg` or `bg`. Its output, and what pg-fence says on the terminal, go to `shell.out`. The tests'
/// commands are bash too: dash starts its commands with vfork, and a SIGTSTP that reaches the child
/// between the vfork and its exec (each failed exec of a PATH search is such a moment) stops the
/// child while dash, waiting for that exec, cannot stop: the group never stops as a whole, with
/// pg-fence as under any shell.
fn job_control_shell(setup: &Setup, job: &str) -> common::Process {
    std::fs::write(setup.path("job.sh"), format!("set -m\n{job}")).unwrap();
    setup.start_on_terminal("shell", "bash job.sh")
}

/// The processes of a job-control test, for a failure's message: those that name `marker`, and
/// the shell.
fn ps(marker: &str) -> String {
    let all = std::process::Command::new("ps").args(["-eo", "pid,ppid,pgid,tpgid,sid,stat,cmd"]).output();
    let all = String::from_utf8_lossy(&all.unwrap().stdout).into_owned();
    all.lines().filter(|line| line.contains(marker) || line.contains("job.sh")).collect::<Vec<_>>().join("\n")
}

/// What the terminal does on Ctrl-Z, once the command's group is in front: SIGTSTP to that group.
fn ctrl_z(marker: &str, command: u32, group: i32) {
    assert!(
        common::eventually(LIMIT, || stat_of(command).is_some_and(|(.., front)| front == group)),
        "the command in front: {}",
        ps(marker)
    );
    std::process::Command::new("kill").args(["-TSTP", "--", &format!("-{group}")]).status().unwrap();
}

/// `pg-fence ARGS -- bash -c "SCRIPT"` (SCRIPT naming `marker`, touching `started`; in double
/// quotes, which the job's shell reads first) run in front by a job-control shell, then stopped by
/// Ctrl-Z; the shell runs `fg` once the file `fg` exists, then writes the job's exit status to
/// `exited` and ends. Returned once the shell has seen its job stop: the shell, the command's pid
/// and its process group.
fn stopped_by_ctrl_z(setup: &Setup, marker: &str, args: &str, script: &str) -> (common::Process, u32, i32) {
    let shell = job_control_shell(
        setup,
        &format!(
            "'{binary}' {args} -- bash -c \"{script}\"\n\
             echo $? > stopped\n\
             while [ ! -e fg ]; do sleep 0.05; done\n\
             fg %1\n\
             echo $? > exited\n",
            binary = env!("CARGO_BIN_EXE_pg-fence")
        ),
    );
    assert!(setup.appears("started"), "{}", shell.stdout());
    let (pg_fence, command, group) = pg_fence_and_command(marker);
    ctrl_z(marker, command, group);
    // The shell sees its job, pg-fence, stop, and takes the terminal back.
    assert!(setup.appears("stopped"), "the shell saw its job stop: {} {}", shell.stdout(), ps(marker));
    let stopped = |pid: u32| stat_of(pid).is_some_and(|(state, ..)| state == 'T');
    assert!(stopped(pg_fence) && stopped(command), "pg-fence stopped with its command: {}", ps(marker));
    (shell, command, group)
}

#[test]
fn ctrl_z_stops_pg_fence_with_its_command_and_fg_continues_both() {
    let setup = Setup::new("cli_ctrl_z", 27928);
    let marker = format!("suspended-{}", std::process::id());
    // What it says when it ends is not in its text, which the shell shows at the stop and at fg.
    let script =
        format!(": {marker}; touch started; while [ ! -e go ]; do sleep 0.05; done; echo ended-\\$((6 * 7))");
    let (mut shell, command, group) = stopped_by_ctrl_z(&setup, &marker, "run job", &script);
    assert_eq!(setup.query_i64("SELECT count(*) FROM fence.leases WHERE key = 'job' AND live"), 1);
    setup.touch("fg");
    assert!(
        common::eventually(LIMIT, || stat_of(command)
            .is_some_and(|(state, _, _, front)| state != 'T' && front == group)),
        "the command continued, in front again: {}",
        ps(&marker)
    );
    setup.touch("go");
    // The shell's end: what it wrote is whole.
    assert_eq!(shell.exit_code(), 0, "{} {}", shell.stdout(), ps(&marker));
    assert_eq!(setup.read("exited").trim(), "0", "{}", shell.stdout());
    assert!(shell.stdout().contains("ended-42"), "{}", shell.stdout());
}

#[test]
fn a_revocation_stops_the_command_at_once_not_at_the_next_renewal() {
    let setup = Setup::new("cli_revoke_watched", 27929);
    // The next renewal of a 10-minute lease is 200 s away, well past LIMIT.
    let script = "trap 'exit 3' TERM; touch started; while :; do sleep 0.05; done";
    let mut run = setup.spawn("run", &[&["run", "--ttl", "10m", "job", "--"][..], &sh(script)].concat());
    assert!(setup.appears("started"), "{}", run.stderr());
    assert_eq!(setup.run("revoke", &["revoke", "job"]).0, 0);
    assert_eq!(run.exit_code(), 76, "{}", run.stderr());
    assert!(
        run.stderr().contains("the lease on job was lost (revoked): sending SIGTERM"),
        "{}",
        run.stderr()
    );
}

#[test]
fn ctrl_z_past_the_ttl_then_fg_never_continues_the_command() {
    let setup = Setup::new("cli_ctrl_z_lost", 27944);
    let marker = format!("stopped-past-{}", std::process::id());
    // Deaf to SIGTERM, it stamps the file every 20 ms for as long as it runs.
    let script =
        format!("trap '' TERM; : {marker}; touch started; while :; do echo tick >> ticks; sleep 0.02; done");
    let (mut shell, ..) = stopped_by_ctrl_z(&setup, &marker, "run --ttl 6s job", &script);
    // Another host takes the key once the lease, renewed no more, has expired.
    let (code, _, stderr) = setup.run("next", &["run", "--wait", "1m", "job", "--", "true"]);
    assert_eq!(code, 0, "the next holder ran: {stderr}");
    let ticks = setup.read("ticks").len();
    setup.touch("fg");
    assert_eq!(shell.exit_code(), 0, "{} {}", shell.stdout(), ps(&marker));
    assert_eq!(setup.read("exited").trim(), "76", "the lease was lost: {}", shell.stdout());
    let gone = common::eventually(LIMIT, || common::pids_running(&marker).is_empty());
    let left = kill_left(&marker);
    assert!(gone, "{left} of the command's processes still ran after pg-fence ended");
    let after = setup.read("ticks")[ticks..].lines().count();
    assert_eq!(after, 0, "the command ran again after fg, beside the next holder: {}", shell.stdout());
    // Killed, not continued: "stopped meanwhile", or on a loaded machine a loss its keeper told first.
    assert!(shell.stdout().contains("SIGKILL"), "{}", shell.stdout());
}

#[test]
fn pg_fence_killed_with_its_whole_process_group_takes_the_command_with_it() {
    use std::os::unix::process::CommandExt;
    let setup = Setup::new("cli_sigkill_group", 27945);
    let marker = format!("group-killed-{}", std::process::id());
    let script = format!(
        "trap '' TERM; : {marker}; (while :; do sleep 0.05; done) & touch started; while :; do sleep 0.05; done"
    );
    // In a group of its own, as under timeout(1) or a supervisor that kills groups.
    let mut cmd = setup.pg_fence(&[&["run", "--kill-after", "1s", "job", "--"][..], &sh(&script)].concat());
    cmd.process_group(0);
    let mut run = setup.start("run", cmd);
    assert!(setup.appears("started"), "{}", run.stderr());
    assert!(common::pids_running(&marker).len() >= 3, "pg-fence, the shell and its worker");
    // SAFETY: only sends a signal to the group of the pg-fence this test started.
    unsafe { libc::killpg(run.pid() as libc::pid_t, libc::SIGKILL) };
    run.exit_code();
    let gone = common::eventually(LIMIT, || common::pids_running(&marker).is_empty());
    let left = kill_left(&marker);
    assert!(gone, "{left} of the command's processes still ran after pg-fence's group was killed");
}

#[test]
fn after_ctrl_z_and_bg_pg_fence_leaves_the_terminal_to_the_shell() {
    let setup = Setup::new("cli_ctrl_z_bg", 27946);
    let marker = format!("backgrounded-{}", std::process::id());
    // pg-fence, stopped, put in the background; once it has ended the shell writes which group has
    // the terminal, and its own (job control off by then: a shell with it takes the terminal back
    // after each foreground job).
    let mut shell = job_control_shell(
        &setup,
        &format!(
            "'{binary}' run job -- bash -c ': {marker}; touch started; while [ ! -e go ]; do sleep 0.05; done'\n\
             echo $? > stopped\n\
             bg %1\n\
             set +m\n\
             wait\n\
             echo $(ps -o tpgid= -p $$) $(ps -o pgid= -p $$) > front\n",
            binary = env!("CARGO_BIN_EXE_pg-fence")
        ),
    );
    assert!(setup.appears("started"), "{}", shell.stdout());
    let (_, command, group) = pg_fence_and_command(&marker);
    ctrl_z(&marker, command, group);
    assert!(setup.appears("stopped"), "the shell saw its job stop: {} {}", shell.stdout(), ps(&marker));
    setup.touch("go");
    assert!(setup.appears("front"), "the job ended: {}", shell.stdout());
    assert_eq!(shell.exit_code(), 0, "{}", shell.stdout());
    let front = setup.read("front");
    let groups: Vec<&str> = front.split_whitespace().collect();
    assert_eq!(groups.len(), 2, "{front}");
    assert_eq!(groups[0], groups[1], "the terminal's group, then the shell's: {}", shell.stdout());
}

#[test]
fn pg_fence_killed_its_command_is_killed_by_the_leases_deadline_whatever_kill_after() {
    let setup = Setup::new("cli_sigkill_deadline", 27947);
    let marker = format!("past-deadline-{}", std::process::id());
    // Deaf to SIGTERM, it stamps the time every 50 ms until it is killed.
    let script = format!(
        "trap '' TERM; : {marker}; touch started; while :; do echo $EPOCHREALTIME >> ticks; sleep 0.05; done"
    );
    let mut run =
        setup.spawn("run", &["run", "--ttl", "6s", "--kill-after", "1h", "job", "--", "bash", "-c", &script]);
    assert!(setup.appears("started"), "{}", run.stderr());
    common::signal(run.pid(), "-KILL");
    run.exit_code();
    ended_before_the_lease(&setup, &marker);
}
