//! `pg-fence elect` and `pg-fence observe` as real processes: a second candidate takes over when
//! the first's command ends, and the observer prints each change, vacancy included.
mod common;
use common::{sh, Setup, LIMIT};

#[test]
fn the_next_candidate_leads_when_the_first_command_ends_and_observe_prints_each_change() {
    let setup = Setup::new("cli_elect", 27910);
    let mut observer = setup.spawn("observer", &["observe", "scheduler", "--json"]);
    let mut text = setup.spawn("observer_text", &["observe", "scheduler"]);
    assert!(
        common::eventually(LIMIT, || observer.stdout().contains(r#""leader":false"#)),
        "the vacancy first"
    );

    let one = "echo $PG_FENCE_OWNER $PG_FENCE_FENCE > one; while [ ! -e go ]; do sleep 0.05; done";
    let mut first =
        setup.spawn("first", &[&["elect", "scheduler", "--value", "one", "--"][..], &sh(one)].concat());
    assert!(setup.appears("one"));
    let mut second = setup.spawn(
        "second",
        &[
            &["elect", "scheduler", "--value", "two", "--"][..],
            &sh("echo $PG_FENCE_OWNER $PG_FENCE_FENCE > two; while [ ! -e go2 ]; do sleep 0.05; done"),
        ]
        .concat(),
    );
    assert!(common::eventually(LIMIT, || observer.stdout().contains(r#""value":"one""#)));
    assert!(second.running() && !setup.path("two").exists(), "the second candidate waits");
    setup.touch("go");
    assert_eq!(first.exit_code(), 0, "{}", first.stderr());
    // The second leads until the observer has seen it: a leadership shorter than one round trip of
    // await_change may be seen only as the vacancy after it.
    assert!(common::eventually(LIMIT, || observer.stdout().contains(r#""value":"two""#)
        && text.stdout().contains("scheduler: leader two (fence ")));
    setup.touch("go2");
    assert_eq!(second.exit_code(), 0, "{}", second.stderr());
    let fence = |file: &str| setup.read(file).split_whitespace().nth(1).unwrap().parse::<i64>().unwrap();
    assert!(setup.read("two").starts_with("two ") && fence("two") > fence("one"));

    // vacancy, one, (vacancy or straight to two), two, vacancy once two resigned. Observers are
    // paced, so the vacancy between one and two is as likely as not: wait for one after two.
    let vacancy_after_two = |out: &str| {
        out.lines().skip_while(|l| !l.contains(r#""value":"two""#)).any(|l| l.contains(r#""leader":false"#))
    };
    assert!(common::eventually(LIMIT, || vacancy_after_two(&observer.stdout())), "{}", observer.stdout());
    let lines: Vec<serde_json::Value> =
        observer.stdout().lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    let values: Vec<&str> = lines.iter().map(|line| line["value"].as_str().unwrap_or("-")).collect();
    let (one_at, two_at) =
        (values.iter().position(|v| *v == "one").unwrap(), values.iter().position(|v| *v == "two").unwrap());
    assert!(values[0] == "-" && one_at < two_at && values.last() == Some(&"-"), "{values:?}");
    assert_eq!(lines[two_at]["fence"], fence("two"));
    assert!(
        common::eventually(LIMIT, || text.stdout().contains("scheduler: leader two (fence ")),
        "{}",
        text.stdout()
    );
    assert!(text.stdout().starts_with("scheduler: no leader\n"));
    assert!(observer.running() && text.running(), "observers run until interrupted");
}

/// The observer's backend stopped (SIGSTOP: its connection goes silent, no reset): `observe` says it
/// cannot see by the watched lease's expiry, not the leader again nor a vacancy, then sees again on
/// a new connection.
#[test]
fn observe_says_when_it_cannot_see() {
    let setup = Setup::new("cli_observe_blind", 27980);
    setup.execute("SELECT fence.lease_acquire('watched', '3 seconds', 'lead')");
    let text = setup.spawn("observer", &["observe", "watched"]);
    assert!(
        common::eventually(LIMIT, || text.stdout().contains("watched: leader lead")),
        "{}",
        text.stdout()
    );
    let backend = common::Frozen::backend(setup.watching_backend());
    let blind_then_vacancy = |out: &str| {
        let after: Vec<&str> = out.lines().skip_while(|line| !line.contains("leader lead")).skip(1).collect();
        after.first().is_some_and(|line| line.starts_with("watched: cannot see ("))
            && after.contains(&"watched: no leader")
    };
    let seen = common::eventually(LIMIT, || blind_then_vacancy(&text.stdout()));
    drop(backend);
    assert!(seen, "{}", text.stdout());
}

/// A revoked leader's command is stopped at once, as `run`'s is: its next renewal, a third of a
/// 10-minute TTL away, is far past LIMIT.
#[test]
fn a_revoked_leaders_command_stops_at_once_not_at_the_next_renewal() {
    let setup = Setup::new("cli_elect_revoked", 27948);
    let script = "trap 'exit 3' TERM; touch started; while :; do sleep 0.05; done";
    let mut leader =
        setup.spawn("leader", &[&["elect", "scheduler", "--ttl", "10m", "--"][..], &sh(script)].concat());
    assert!(setup.appears("started"), "{}", leader.stderr());
    assert_eq!(setup.run("revoke", &["revoke", "scheduler"]).0, 0);
    assert_eq!(leader.exit_code(), 76, "{}", leader.stderr());
    assert!(
        leader.stderr().contains("the lease on scheduler was lost (revoked): sending SIGTERM"),
        "{}",
        leader.stderr()
    );
}
