//! Runs a file of clients/behaviours, the scenarios every client's suite runs, against real servers:
//! one scenario after the other, a failing one not stopping the others, each reported.
use super::{cluster, run};
use pg_fence_integration::Cluster;
use serde_json::Value;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

/// A scenario's run: Err says which step failed, and how.
pub type Outcome<'a> = Pin<Box<dyn Future<Output = Result<(), String>> + 'a>>;

/// The behaviours of `file`, whose documented steps must be `kinds`: a step added to the file fails
/// here until the suite runs it.
pub fn load(file: &str, kinds: &[&str]) -> Value {
    let path = format!("{}/../behaviours/{file}", env!("CARGO_MANIFEST_DIR"));
    let behaviours: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut documented: Vec<&str> =
        behaviours["steps"].as_object().unwrap().keys().map(String::as_str).collect();
    let mut run = kinds.to_vec();
    documented.sort_unstable();
    run.sort_unstable();
    assert_eq!(documented, run, "every step {file} documents is run here");
    behaviours
}

/// The step's kind: its one key that names a step (serde_json sorts keys, so it need not be first).
pub fn kind<'a>(step: &Value, kinds: &[&'a str]) -> &'a str {
    kinds.iter().find(|kind| step.get(**kind).is_some()).unwrap_or_else(|| panic!("no step kind in {step}"))
}

pub fn seconds(value: &Value) -> Duration {
    Duration::from_secs_f64(value.as_f64().expect("seconds"))
}

pub fn ensure(ok: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(why())
    }
}

/// Runs every scenario of `behaviours` through `scenario`, on one cluster (`shared`: name, port),
/// but each scenario that crashes the server on a new one of its own (`own`): after a crash the
/// first grant waits for the clock to pass the fast reservation (up to 10 s), which would hold up the
/// next scenario. Fails the test, listing the scenarios that failed.
pub fn run_every(
    behaviours: &Value,
    shared: (&str, u16),
    own: (&str, u16),
    scenario: impl for<'a> Fn(&'a Cluster, &'a Value) -> Outcome<'a>,
) {
    let shared = cluster(shared.0, shared.1);
    let failed = run(async {
        let mut failed = Vec::new();
        for behaviour in behaviours["scenarios"].as_array().unwrap() {
            let name = behaviour["name"].as_str().unwrap();
            let crashes =
                behaviour["steps"].as_array().unwrap().iter().any(|step| step.get("crash_server").is_some());
            let own = crashes.then(|| tokio::task::block_in_place(|| cluster(own.0, own.1)));
            let started = Instant::now();
            let limit = Duration::from_secs(120);
            let outcome =
                tokio::time::timeout(limit, scenario(own.as_ref().unwrap_or(&shared), behaviour)).await;
            let outcome = outcome.unwrap_or_else(|_| Err(format!("took over {limit:?}")));
            println!("{name}: {} ({:?})", if outcome.is_ok() { "ok" } else { "FAILED" }, started.elapsed());
            if let Err(err) = outcome {
                println!("    {err}");
                failed.push(format!("{name}: {err}"));
            }
        }
        failed
    });
    assert!(failed.is_empty(), "{} scenario(s) failed:\n{}", failed.len(), failed.join("\n"));
}
