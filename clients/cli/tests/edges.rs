//! Loss handling at its edges, on ports 27950-27959, 27918, 27919 and 27939 (one a test): a group that outlives its leader, signals that
//! reach pg-fence before the command has started.
mod common;
use common::{sh, Setup, LIMIT};
use std::time::Duration;

/// Whether `pid` runs (a zombie no longer does).
fn alive(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
}

#[test]
fn a_lost_lease_kills_the_whole_group_even_when_its_leader_ends_on_sigterm() {
    let setup = Setup::new("cli_group_kill", 27950);
    // The shell ends on SIGTERM; the sleep it started, in its group, ignores it.
    let script = "(trap '' TERM; exec sleep 300) & echo $! > kid; trap 'exit 0' TERM; touch started; wait";
    let mut run =
        setup.spawn("run", &[&["run", "--kill-after", "1s", "job", "--"][..], &sh(script)].concat());
    assert!(setup.appears("started") && setup.appears("kid"));
    let kid: i32 = setup.read("kid").trim().parse().unwrap();
    assert_eq!(setup.run("revoke", &["revoke", "job"]).0, 0);
    assert_eq!(run.exit_code(), 76, "{}", run.stderr());
    assert!(
        common::eventually(Duration::from_secs(2), || !alive(kid)),
        "the group's sleep still runs after pg-fence exited: {}",
        run.stderr()
    );
    // SAFETY: kill only sends a signal; cleanup of a failed run.
    unsafe { libc::kill(kid, libc::SIGKILL) };
}

/// The holder `hold` (`run` or `elect` ARGS -- a command that runs until `go` exists) and a second
/// pg-fence `wait` (ARGS, its command touching `ran`) of the same key, which gets SIGINT while it
/// waits on the server; then the holder ends. The key must be free, and `ran` not made.
fn interrupt_while_waiting(setup: &Setup, hold: &[&str], wait: &[&str], key: &str) {
    let script = "touch started; while [ ! -e go ]; do sleep 0.05; done";
    let mut holder = setup.spawn("holder", &[hold, &["--"], &sh(script)].concat());
    assert!(setup.appears("started"), "{}", holder.stderr());
    let mut waiter = setup.spawn("waiter", &[wait, &["--", "touch", "ran"]].concat());
    // The waiter's acquire, not the holder's watch of its lease (await_change), which waits too.
    let waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Extension' \
                   AND query NOT LIKE '%await_change%'";
    assert!(common::eventually(LIMIT, || setup.query_i64(waiting) == 1), "{}", waiter.stderr());
    common::signal(waiter.pid(), "-INT");
    let code = waiter.exit_code();
    setup.touch("go");
    assert_eq!(holder.exit_code(), 0, "{}", holder.stderr());
    std::thread::sleep(Duration::from_millis(500));
    let live = format!("SELECT count(*) FROM fence.leases WHERE key = '{key}' AND live");
    let owners = format!(
        "SELECT coalesce(string_agg(owner || ' fence ' || fence || ' since ' || acquired_at, ', '), '') \
         FROM fence.leases WHERE key = '{key}' AND live"
    );
    assert_eq!(
        setup.query_i64(&live),
        0,
        "a lease left behind by the interrupted wait ({}); the holder said: {}; the waiter: {}",
        setup.cluster.connect().query_one(owners.as_str(), &[]).unwrap().get::<_, String>(0),
        holder.stderr(),
        waiter.stderr()
    );
    assert!(!setup.path("ran").exists());
    assert_eq!(code, 130, "128 + SIGINT: {}", waiter.stderr());
}

#[test]
fn a_signal_while_waiting_for_the_key_leaves_no_lease_and_starts_nothing() {
    let setup = Setup::new("cli_wait_signal", 27951);
    interrupt_while_waiting(&setup, &["run", "--ttl", "30s", "job"], &["run", "--ttl", "30s", "job"], "job");
}

#[test]
fn durations_too_long_to_count_are_bad_usage_and_reach_no_server() {
    for option in ["--wait", "--ttl", "--kill-after", "--at-least", "--retry-for"] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_pg-fence"))
            .args(["--dsn", "host=127.0.0.1 port=27949", "run", option, "1e19", "job", "--", "true"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{option} 1e19: {stderr}");
        assert!(!stderr.contains("connect"), "{option} 1e19: {stderr}");
    }
}

#[test]
fn the_lease_is_kept_until_what_the_command_left_in_its_group_has_ended() {
    let setup = Setup::new("cli_group_left", 27952);
    // The shell exits at once; the job it started in the background runs on in its group.
    let script = "(sleep 1; touch job_done) & exit 4";
    let (code, _, stderr) = setup.run("run", &[&["run", "job", "--"][..], &sh(script)].concat());
    assert_eq!(code, 4, "the command's own status: {stderr}");
    assert!(setup.path("job_done").exists(), "pg-fence released the lease while the job still ran");
    assert_eq!(setup.query_i64("SELECT count(*) FROM fence.leases WHERE key = 'job' AND live"), 0);
}

#[test]
fn a_signal_while_campaigning_leaves_no_leader_behind() {
    let setup = Setup::new("cli_elect_signal", 27953);
    let (one, two) =
        (["elect", "--ttl", "30s", "sched", "--value", "one"], ["elect", "--ttl", "30s", "sched"]);
    interrupt_while_waiting(&setup, &one, &two, "sched");
}

#[test]
fn a_closed_stderr_does_not_keep_a_lost_lease_from_stopping_the_command() {
    let setup = Setup::new("cli_closed_stderr", 27954);
    // The command's own stderr elsewhere: a write to the closed pipe would end it with SIGPIPE.
    let script =
        "exec 2>/dev/null; trap 'touch stopped; exit 3' TERM; touch started; while :; do sleep 0.05; done";
    let mut cmd = setup.pg_fence(&[&["run", "--kill-after", "30s", "job", "--"][..], &sh(script)].concat());
    // Whoever read pg-fence's stderr (a pipe to a logger) has gone.
    let mut run =
        cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    drop(run.stderr.take());
    assert!(setup.appears("started"));
    assert_eq!(setup.run("revoke", &["revoke", "job"]).0, 0);
    let stopped = common::eventually(Duration::from_secs(10), || setup.path("stopped").exists());
    let code = common::eventually(Duration::from_secs(10), || run.try_wait().unwrap().is_some())
        .then(|| run.wait().unwrap().code());
    if !stopped {
        // The command ran on: the harness's cleanup does not know this pg-fence.
        common::pids_running("trap 'touch stopped").into_iter().for_each(|pid| common::signal(pid, "-KILL"));
    }
    run.kill().ok();
    assert!(stopped, "the command got no SIGTERM; pg-fence exited {code:?}");
    assert_eq!(code, Some(Some(76)));
}

#[test]
fn leases_watch_into_a_reader_that_has_gone_ends_quietly() {
    use std::io::BufRead;
    use std::os::unix::process::ExitStatusExt;
    let setup = Setup::new("cli_closed_stdout", 27955);
    let mut holder = setup.hold_until("holder", &["job"], "started", "go");
    let mut cmd = setup.pg_fence(&["leases", "--json", "--watch", "--interval", "100ms"]);
    let mut watch =
        cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    // As `| head -1` reads.
    let mut line = String::new();
    std::io::BufReader::new(watch.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert!(line.contains(r#""key":"job""#), "{line}");
    let ended = common::eventually(LIMIT, || watch.try_wait().unwrap().is_some());
    watch.kill().ok();
    let status = watch.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut watch.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(ended && status.signal() == Some(libc::SIGPIPE), "{status:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    setup.touch("go");
    assert_eq!(holder.exit_code(), 0);
}

#[test]
fn on_a_terminal_the_command_can_read_it() {
    let setup = Setup::new("cli_terminal_read", 27956);
    // A command that reads the terminal (a prompt): from a background group it would be stopped
    // by SIGTTIN, its lease renewed for ever.
    let script = "read answer < /dev/tty; touch read";
    let mut run = setup.spawn_on_terminal("run", &[&["run", "job", "--"][..], &sh(script)].concat());
    let read = common::eventually(Duration::from_secs(10), || setup.path("read").exists());
    let states: Vec<String> = common::pids_running("read answer")
        .iter()
        .map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default())
        .collect();
    assert!(read, "the command could not read its terminal: {states:?} {}", run.stdout());
    assert_eq!(run.exit_code(), 0, "{}", run.stdout());
}

#[test]
fn on_a_terminal_a_free_key_is_not_said_to_be_held() {
    let setup = Setup::new("cli_terminal_free", 27957);
    let mut run = setup.spawn_on_terminal("run", &["run", "job", "--", "echo", "ran"]);
    assert_eq!(run.exit_code(), 0, "{}", run.stdout());
    assert_eq!(run.stdout().trim(), "ran", "nothing but the command's output");
}

#[test]
fn a_killed_pg_fence_leaves_its_command_a_sigterm() {
    let setup = Setup::new("cli_killed", 27958);
    let script = "trap 'touch stopped; exit 3' TERM; touch started; while :; do sleep 0.05; done";
    let mut run = setup.spawn("run", &[&["run", "--ttl", "30s", "job", "--"][..], &sh(script)].concat());
    assert!(setup.appears("started"));
    // The OOM killer's way: nothing of pg-fence runs after it.
    common::signal(run.pid(), "-KILL");
    run.exit_code();
    assert!(
        common::eventually(Duration::from_secs(5), || setup.path("stopped").exists()),
        "the command runs on without anyone renewing its lease"
    );
}

#[test]
fn a_watch_interval_of_zero_is_bad_usage() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_pg-fence"))
        .args([
            "--dsn",
            "host=127.0.0.1 port=27949",
            "--retry-for",
            "0s",
            "leases",
            "--watch",
            "--interval",
            "0",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "a loop without pause on the server: {stderr}");
}

#[test]
fn orphans_of_the_command_do_not_pile_up_as_zombies_while_it_runs() {
    let setup = Setup::new("cli_orphans", 27918);
    // Each subshell ends at once, leaving its sleep to its adoptive parent, pg-fence.
    let script = "for i in 1 2 3 4 5 6 7 8; do (sleep 0.01 &); done; touch started; while [ ! -e go ]; do sleep 0.05; done";
    let mut run = setup.spawn("run", &[&["run", "job", "--"][..], &sh(script)].concat());
    assert!(setup.appears("started"));
    let zombies = || {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", run.pid())).into_iter().flatten().flatten();
        let children: Vec<String> = tasks
            .flat_map(|task| {
                let text = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
                text.split_whitespace().map(str::to_owned).collect::<Vec<_>>()
            })
            .collect();
        children
            .iter()
            .filter(|pid| {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
            })
            .count()
    };
    std::thread::sleep(Duration::from_secs(3));
    let left = zombies();
    setup.touch("go");
    assert_eq!(run.exit_code(), 0, "{}", run.stderr());
    assert_eq!(left, 0, "zombie children of pg-fence while its command runs");
}

#[test]
fn a_lease_lost_before_the_command_ended_is_said_and_not_taken_for_success() {
    let setup = Setup::new("cli_lost_unnoticed", 27919);
    for at_least in [&[][..], &["--at-least", "1m"]] {
        for file in ["started", "go"] {
            let _ = std::fs::remove_file(setup.path(file));
        }
        // Revoked between two renewals: the command ends before pg-fence would have heard of it.
        // A shared lease, whose end pg-fence hears of at a renewal only (an exclusive one it watches).
        let mut run = setup.hold_until(
            "run",
            &[at_least, &["--shared", "--ttl", "30s", "job"]].concat(),
            "started",
            "go",
        );
        assert_eq!(setup.run("revoke", &["revoke", "job"]).0, 0);
        setup.touch("go");
        let code = run.exit_code();
        let stderr = run.stderr();
        assert!(stderr.contains("was lost before the command ended"), "{at_least:?}: {stderr}");
        assert_eq!(code, 76, "{at_least:?}: {stderr}");
    }
}

#[test]
fn a_leadership_lost_before_the_command_ended_is_said_and_not_taken_for_success() {
    let setup = Setup::new("cli_lost_leader", 27939);
    let script = "touch started; while [ ! -e go ]; do sleep 0.05; done";
    let mut elect =
        setup.spawn("elect", &[&["elect", "--ttl", "30s", "sched", "--"][..], &sh(script)].concat());
    assert!(setup.appears("started"));
    // Revoked unseen until the command has ended: `elect` watches its leadership on the server (a
    // revocation stops the command at once), so the watch's backend is stopped meanwhile.
    let backend = common::Frozen::backend(setup.watching_backend());
    assert_eq!(setup.run("revoke", &["revoke", "sched"]).0, 0);
    setup.touch("go");
    let code = elect.exit_code();
    drop(backend);
    let stderr = elect.stderr();
    assert!(stderr.contains("the leadership of sched was lost before the command ended"), "{stderr}");
    assert_eq!(code, 76, "{stderr}");
}

#[test]
fn the_man_pages_are_one_per_command_and_name_only_pages_that_exist() {
    let dir = common::ScratchDir::create("cli_man_pages");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_pg-fence"))
        .args(["man", "--dir"])
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(status.success());
    let pages: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    for command in ["run", "elect", "observe", "leases", "status", "revoke", "stats"] {
        assert!(pages.contains(&format!("pg-fence-{command}.1")), "pg-fence-{command}.1 in {pages:?}");
    }
    for page in &pages {
        let roff = std::fs::read_to_string(dir.path().join(page)).unwrap();
        for named in roff.split("pg\\-fence\\-").skip(1) {
            let name = named.split(|c: char| !c.is_ascii_alphanumeric()).next().unwrap();
            assert!(
                pages.contains(&format!("pg-fence-{name}.1")),
                "{page} names pg-fence-{name}(1), not written"
            );
        }
    }
    let run = std::fs::read_to_string(dir.path().join("pg-fence-run.1")).unwrap();
    assert!(
        run.contains("fence_guard") && run.contains("\\-\\-kill\\-after"),
        "run's page has its options and examples"
    );
}
