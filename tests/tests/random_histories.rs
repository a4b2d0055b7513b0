//! Fences never go back, on histories made up at random (src/random_history.rs): grants of every
//! kind and mode composed with clock steps, crashes, immediate and clean shutdowns, switches of the
//! fast leases' store, sweeps, revokes, new backends and DROP/CREATE EXTENSION. Bounded for the test
//! command (RANDOM_HISTORY_SECONDS, default 60); `pg_test/run-histories SECONDS` runs it longer.
//! RANDOM_HISTORY_SEED replays a history.
use pg_fence_integration::random_history::{self, Config};
use std::time::Duration;

fn from_env(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|value| value.parse().unwrap_or_else(|_| panic!("{name}: a whole number")))
}

#[test]
fn fences_never_go_back_on_random_histories() {
    let seconds = from_env("RANDOM_HISTORY_SECONDS").unwrap_or(60);
    let seed = from_env("RANDOM_HISTORY_SEED").unwrap_or_else(rand::random);
    let config = Config { name: "random_history", port: 26971, duration: Duration::from_secs(seconds), seed };
    let counts = random_history::run(&config);
    println!("random history, seed {seed}: {counts}");
    // The history must have put the rule to the test: fences above the clock, and restarts.
    assert!(counts.grants >= 50, "too few grants to mean anything: {counts}");
    assert!(
        counts.steps_back >= 1 && counts.most_behind_fences_s > 1.0,
        "the clock never fell behind the fences: {counts}"
    );
    assert!(
        counts.crashes + counts.immediate_shutdowns + counts.clean_shutdowns >= 1,
        "the server never went down: {counts}"
    );
}
