//! The crontab example of the README, run for real: the same job started every second from three
//! "hosts" (processes), each run writing under its fence; never two overlapping runs' writes
//! accepted, and at most one run per --at-least period.
mod common;
use common::Setup;
use std::time::Duration;

/// The job of the example: three guarded writes, a little apart, each stamped by the server.
const JOB: &str = "for i in 1 2 3; do psql -X -q -v ON_ERROR_STOP=1 -c \"INSERT INTO report_runs \
    SELECT $PG_FENCE_FENCE, clock_timestamp() WHERE fence.fence_guard('$PG_FENCE_KEY', $PG_FENCE_FENCE)\" || exit 1; \
    sleep 0.2; done";

#[test]
fn three_hosts_start_the_job_every_second_and_only_one_run_writes_at_a_time() {
    let setup = Setup::new("cli_cron", 27920);
    setup.execute("CREATE TABLE report_runs (fence bigint, at timestamptz)");
    let mut statuses = Vec::new();
    std::thread::scope(|scope| {
        let hosts: Vec<_> = (0..3)
            .map(|host| {
                let setup = &setup;
                scope.spawn(move || {
                    let mut runs = Vec::new();
                    for tick in 0..5 {
                        let name = format!("host{host}_{tick}");
                        runs.push(setup.spawn(
                            &name,
                            &[
                                "run",
                                "--no-wait",
                                "--ttl",
                                "10s",
                                "--at-least",
                                "900ms",
                                "nightly-report",
                                "--",
                                "sh",
                                "-c",
                                JOB,
                            ],
                        ));
                        std::thread::sleep(Duration::from_secs(1));
                    }
                    runs.iter_mut().map(|run| (run.exit_code(), run.stderr())).collect::<Vec<_>>()
                })
            })
            .collect();
        for host in hosts {
            statuses.extend(host.join().unwrap());
        }
    });
    assert!(statuses.iter().all(|(code, _)| *code == 0 || *code == 75), "{statuses:?}");
    let ran = statuses.iter().filter(|(code, _)| *code == 0).count();
    let client = &mut setup.cluster.connect();
    let runs = client
        .query("SELECT fence, min(at) AS first, max(at) AS last, count(*) FROM report_runs GROUP BY fence ORDER BY min(at)", &[])
        .unwrap();
    assert_eq!(runs.len(), ran, "a fence per run that ran");
    assert!(ran >= 2, "more than one period's run: {statuses:?}");
    for run in &runs {
        assert_eq!(run.get::<_, i64>(3), 3, "each run's three writes were accepted");
    }
    for pair in runs.windows(2) {
        let (earlier_last, later_first): (std::time::SystemTime, std::time::SystemTime) =
            (pair[0].get(2), pair[1].get(1));
        assert!(earlier_last < later_first, "two runs' writes overlap");
        assert!(pair[0].get::<_, i64>(0) < pair[1].get::<_, i64>(0), "each later run has a higher fence");
    }
}
