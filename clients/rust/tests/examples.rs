//! The examples, each run as its own process against a scratch cluster for a few seconds:
//! they must finish cleanly and report the leases their chaos took away as lost, with every write
//! under a stale fence refused. Their counts are printed for the record.
mod common;
use common::cluster;
use std::path::PathBuf;
use std::process::Command;

/// `cargo test` builds the examples beside the test binaries, in target/<profile>/examples.
fn example(name: &str) -> PathBuf {
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    deps.parent().unwrap().join("examples").join(name)
}

/// The number after `label` in the example's output.
fn count(output: &str, label: &str) -> u64 {
    let line = output.lines().find(|line| line.contains(label)).unwrap_or_else(|| panic!("no {label:?}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

fn run_example(name: &str, port: u16) -> String {
    let cluster = cluster(&format!("rc_ex_{name}"), port);
    let conninfo = format!("host=127.0.0.1 port={} user=postgres dbname=postgres", cluster.port());
    let out =
        Command::new(example(name)).args([&conninfo, "--seconds", "7"]).output().expect("run the example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(out.status.success(), "{name} failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(count(&stdout, "fenced writes") > 0, "{name} wrote nothing");
    assert!(count(&stdout, "leases declared lost") >= 1, "{name}: the chaos took leases and nobody was told");
    stdout.into_owned()
}

#[test]
fn singleton_job() {
    run_example("singleton_job", 27560);
}

#[test]
fn resource_workers() {
    run_example("resource_workers", 27561);
}

#[test]
fn leader_election() {
    let out = run_example("leader_election", 27562);
    // Each term's leader, and the vacancy a terminated session leaves, at the least.
    assert!(count(&out, "leader changes observed") >= 2, "the observer saw no change of leader");
}

#[test]
fn semaphore() {
    run_example("semaphore", 27578);
}

#[test]
fn readers_writers() {
    let out = run_example("readers_writers", 27579);
    assert!(count(&out, "consistent reads") > 0, "no reader read the document");
    assert_eq!(count(&out, "torn reads"), 0, "a reader saw a title and a body of two versions");
}

#[test]
fn transfers() {
    // The example checks that the total balance is what it was, and fails if not.
    run_example("transfers", 27580);
}
