//! `pg-fence run` where the server, not pg-fence, has the last word: an --at-least that the
//! server's pg_fence.max_ttl refuses, for a role that may not read the setting; an acquire whose
//! reply was lost; a revocation watch that the server keeps refusing.
mod common;
#[allow(dead_code)]
#[path = "../../rust/tests/common/proxy.rs"]
mod proxy;
use common::{sh, Setup, LIMIT};
use pg_fence_integration::{edition, Edition};
use proxy::{Cut, Proxy};

/// A login role with fence_user only, as the README asks of an application's role.
fn user_role(setup: &Setup, role: &str) {
    setup.execute(&format!("CREATE ROLE {role} LOGIN; GRANT fence_user TO {role}"));
}

/// pg_fence.max_ttl for the whole server (the extension) or database (the SQL edition), waited for
/// until a new session of `role` is refused a longer TTL.
fn lower_max_ttl(setup: &Setup, max_ttl: &str, role: &str) {
    let mut admin = setup.cluster.connect();
    match edition() {
        Edition::Extension => {
            // The setting is known to a session once it has loaded the library.
            admin.batch_execute("LOAD 'pg_fence'").unwrap();
            admin.batch_execute(&format!("ALTER SYSTEM SET pg_fence.max_ttl = '{max_ttl}'")).unwrap();
            admin.batch_execute("SELECT pg_reload_conf()").unwrap();
        }
        Edition::Sql => {
            admin
                .execute("UPDATE fence.settings SET value = $1 WHERE name = 'max_ttl'", &[&max_ttl])
                .unwrap();
        }
    }
    let refused = || {
        let mut session = setup.cluster.connect_as(role);
        let tried = session.query_one("SELECT fence.lease_acquire('probe', $1::text::interval)", &[&"2h"]);
        tried.is_err_and(|err| pg_fence_integration::sqlstate(&err).starts_with("22"))
    };
    assert!(common::eventually(LIMIT, refused), "max_ttl {max_ttl} took effect");
}

#[test]
fn an_at_least_the_server_refuses_is_status_64_for_a_role_that_cannot_read_max_ttl() {
    let setup = Setup::new("cli_at_least_user", 27913);
    user_role(&setup, "runner");
    lower_max_ttl(&setup, "1h", "runner");
    let as_runner = ["--dsn", "user=runner", "run"];
    let args = [&as_runner[..], &["--at-least", "2h", "weekly", "--", "touch", "ran"]].concat();
    let (code, _, stderr) = setup.run("long", &args);
    assert_eq!(code, 64, "{stderr}");
    assert!(!setup.path("ran").exists(), "the command did not run: {stderr}");
    assert!(
        stderr.contains("--at-least 2h is longer than the server's pg_fence.max_ttl")
            && stderr.contains("HINT: raise pg_fence.max_ttl"),
        "{stderr}"
    );
    assert_eq!(
        setup.query_i64("SELECT count(*) FROM fence.leases WHERE key = 'weekly' AND live"),
        0,
        "released"
    );
    // Within the limit: kept that long after the grant, as the superuser's run keeps it.
    let args = [&as_runner[..], &["--at-least", "50m", "weekly", "--", "touch", "ran"]].concat();
    let (code, _, stderr) = setup.run("within", &args);
    assert_eq!(code, 0, "{stderr}");
    assert!(setup.path("ran").exists(), "{stderr}");
    let held_for = setup.query_i64(
        "SELECT extract(epoch FROM expires_at - acquired_at)::bigint FROM fence.leases WHERE key = 'weekly' AND live",
    );
    assert_eq!(held_for, 50 * 60, "kept 50 minutes after the grant");
}

#[test]
fn an_at_least_that_max_ttl_lowered_during_the_wait_no_longer_allows_is_status_64() {
    let setup = Setup::new("cli_at_least_lowered", 27916);
    let mut holder = setup.hold_until("holder", &["weekly"], "started", "go");
    let mut waiter = setup.spawn("waiter", &["run", "--at-least", "2h", "weekly", "--", "touch", "ran"]);
    // Past pg-fence's own reading of the setting: its acquire waits on the server.
    let waiting = "SELECT count(*) FROM pg_stat_activity \
                   WHERE query LIKE '%lease_acquire%' AND state = 'active' AND pid <> pg_backend_pid()";
    assert!(common::eventually(LIMIT, || setup.query_i64(waiting) == 1), "{}", waiter.stderr());
    lower_max_ttl(&setup, "1h", "postgres");
    setup.touch("go");
    assert_eq!(holder.exit_code(), 0, "{}", holder.stderr());
    assert_eq!(waiter.exit_code(), 64, "{}", waiter.stderr());
    assert!(!setup.path("ran").exists(), "the command did not run: {}", waiter.stderr());
    assert!(waiter.stderr().contains("HINT: raise pg_fence.max_ttl"), "{}", waiter.stderr());
    assert_eq!(setup.query_i64("SELECT count(*) FROM fence.leases WHERE key = 'weekly' AND live"), 0);
}

#[test]
fn an_acquire_whose_reply_was_lost_releases_what_it_may_have_been_granted() {
    let setup = Setup::new("cli_lost_reply", 27914);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let proxy = runtime.block_on(Proxy::start(setup.cluster.port()));
    proxy.drop_reply_to("lease_acquire", Cut::Both);
    // No retry: the acquire's outcome stays unknown.
    let mut cmd = setup.pg_fence(&["--retry-for", "0s", "run", "--ttl", "10m", "job", "--", "touch", "ran"]);
    cmd.env("PGPORT", proxy.port.to_string());
    let mut run = setup.start("run", cmd);
    assert_eq!(run.exit_code(), 69, "{}", run.stderr());
    assert!(proxy.dropped_bytes() > 0, "the acquire's reply was dropped: {}", run.stderr());
    assert!(!setup.path("ran").exists(), "the command did not run");
    assert_eq!(
        setup.query_i64("SELECT count(*) FROM fence.leases WHERE key = 'job' AND live"),
        0,
        "the grant whose reply was lost was released, not left to its 10-minute TTL: {}",
        run.stderr()
    );
    assert_eq!(setup.run("next", &["run", "--no-wait", "job", "--", "true"]).0, 0, "the key is free");
}

#[test]
fn an_at_least_the_server_gave_no_answer_on_is_not_run() {
    let setup = Setup::new("cli_at_least_unanswered", 27917);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let proxy = runtime.block_on(Proxy::start(setup.cluster.port()));
    // The extension of the lease to --at-least, sent at once; the keeper's first renewal is 10 s away.
    proxy.drop_reply_to("lease_renew", Cut::Both);
    let args = ["--retry-for", "0s", "run", "--at-least", "2h", "weekly", "--", "touch", "ran"];
    let mut cmd = setup.pg_fence(&args);
    cmd.env("PGPORT", proxy.port.to_string());
    let mut run = setup.start("run", cmd);
    assert_eq!(run.exit_code(), 69, "{}", run.stderr());
    assert!(proxy.dropped_bytes() > 0, "the renewal's reply was dropped: {}", run.stderr());
    assert!(!setup.path("ran").exists(), "the command did not run: {}", run.stderr());
    assert!(run.stderr().contains("could not be extended to --at-least 2h"), "{}", run.stderr());
    assert_eq!(
        setup.query_i64("SELECT count(*) FROM fence.leases WHERE key = 'weekly' AND live"),
        0,
        "released: {}",
        run.stderr()
    );
}

#[test]
fn a_watch_the_server_keeps_refusing_is_given_up_not_retried_every_second() {
    let setup = Setup::new("cli_watch_refused", 27915);
    user_role(&setup, "hurried");
    // Shorter than a watch's step: every watch is cancelled (57014).
    setup.execute("ALTER ROLE hurried SET statement_timeout = '1s'");
    let script = "touch started; while [ ! -e go ]; do sleep 0.05; done";
    let args = [&["--dsn", "user=hurried", "run", "--ttl", "10m", "job", "--"][..], &sh(script)].concat();
    let mut run = setup.spawn("run", &args);
    assert!(setup.appears("started"), "{}", run.stderr());
    let given_up =
        common::eventually(LIMIT, || run.stderr().contains("pg-fence: not watching job for a revocation"));
    assert!(given_up, "the watch still ran after {LIMIT:?}: {}", run.stderr());
    assert!(run.stderr().contains("canceling statement due to statement timeout"), "{}", run.stderr());
    let sessions = "SELECT count(*) FROM pg_stat_activity WHERE usename = 'hurried'";
    assert!(
        common::eventually(LIMIT, || setup.query_i64(sessions) == 1),
        "only the keeper's connection left: {} sessions",
        setup.query_i64(sessions)
    );
    setup.touch("go");
    assert_eq!(run.exit_code(), 0, "{}", run.stderr());
}
