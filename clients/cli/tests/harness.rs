//! The tests' own harness: a test that fails while its pg-fence runs a command leaves neither
//! behind, though the command runs in a process group of its own.
mod common;
use common::{sh, Setup, LIMIT};

#[test]
fn a_failing_test_leaves_no_command_running() {
    let setup = Setup::new("cli_harness", 27941);
    // The test's pid marks this run's command, which no other run's has.
    let marker = format!("harness-{}", std::process::id());
    let script = format!("trap '' TERM; touch started; : {marker}; while :; do sleep 0.05; done");
    let failed = std::panic::catch_unwind(|| {
        let _run = setup.spawn("run", &[&["run", "job", "--"][..], &sh(&script)].concat());
        let _shown = setup.spawn_on_terminal("shown", &[&["run", "other", "--"][..], &sh(&script)].concat());
        assert!(setup.appears("started"));
        assert!(common::eventually(LIMIT, || common::pids_running(&marker).len() >= 2));
        panic!("a test failing while its commands run");
    });
    assert!(failed.is_err());
    assert!(
        common::eventually(LIMIT, || common::pids_running(&marker).is_empty()),
        "the commands and what they started are gone"
    );
}
