//! The torture run, short enough for CI: 8 clients on 4 keys take leases, write under their fences,
//! renew and release, through pauses past the TTL, connections cut mid-call, terminated backends
//! and kill -9 of the server (2-3 times), then the history checker (src/torture.rs) looks for any
//! violation of pg_fence's invariants. TORTURE_SECONDS sets the workload's length (default 90);
//! `pg_test/run-torture` runs it for longer.
use pg_fence_integration::torture::{
    self, check, AckedGrant, Acknowledged, History, LeaseChange, LeaseChangeKind, Violation, Workload,
};
use pg_fence_integration::Cluster;
use std::time::Duration;

fn torture_seconds() -> u64 {
    match std::env::var("TORTURE_SECONDS") {
        Ok(seconds) => seconds.parse().expect("TORTURE_SECONDS must be a whole number of seconds"),
        Err(_) => 90,
    }
}

#[test]
fn leases_and_fenced_writes_keep_their_invariants_through_faults_and_crashes() {
    // Commit timestamps order the history; the lazy WAL writer leaves asynchronous commits
    // (releases) unflushed for long, so that a crash can lose acknowledged releases.
    let settings = ["track_commit_timestamp=on", "wal_writer_delay=10s", "wal_writer_flush_after=1GB"];
    let cluster = Cluster::start("torture", 27001, &settings);
    let connect = || cluster.try_connect();
    let crash_and_restart = || {
        cluster.crash();
        cluster.restart();
    };
    let duration = Duration::from_secs(torture_seconds());
    // A crash about every 30 s, the first after about 15 s: 3 (sometimes 2) in the default 90 s.
    let workload = Workload { duration, server_fault_every: Duration::from_secs(30), ..Workload::default() };

    let report = torture::run(&workload, &connect, Some(&crash_and_restart));

    // The report is printed above: the counts, and each kind of violation with examples.
    assert_eq!(report.violations.total(), 0, "violations of pg_fence's invariants");
    assert_eq!(report.counts.unexpected_errors, 0, "errors that no fault explains");
    // The run must have done something worth checking.
    let counts = &report.counts;
    assert!(counts.grants >= 300 && counts.accepted_writes >= 300, "too little work to mean anything");
    assert!(counts.stale_writes >= 1, "no stale write was ever attempted");
    assert!(counts.unknown >= 1, "no call was ever cut short");
    assert!(counts.crashes >= 1, "the server never crashed");
    assert!(counts.fast_grants >= 100, "too few fast leases");
}

/// The checker judges fences by their order alone, as pg_fence promises them: grants of clock-sized
/// fences with gaps between them pass, and a grant not above the previous one is caught, whether it
/// repeats a fence or goes below it. (No server: a history made up here.)
#[test]
fn the_checker_orders_fences_without_counting_them() {
    let history = |fences: &[i64]| {
        let leases = fences
            .iter()
            .zip(0..)
            .map(|(&fence, i)| {
                let at = 1_000_000 + i * 1_000;
                LeaseChange {
                    key: "key-0".into(),
                    fence,
                    kind: LeaseChangeKind::Grant,
                    acquired_us: at,
                    expires_us: at + 100,
                    by: "torture-client-0".into(),
                    committed_us: at + 1,
                    durable: true,
                    server_start_us: 0,
                }
            })
            .collect();
        let last = *fences.iter().max().unwrap();
        History { leases, writes: Vec::new(), final_fences: vec![("key-0".to_string(), last)] }
    };
    let fence = 1_796_126_851_580_275;
    let increasing =
        check(&history(&[fence, fence + 1, fence + 7_000, fence + 7_001]), &Acknowledged::default());
    assert_eq!(increasing.total(), 0, "{increasing}");
    for not_above in [fence + 7_000, fence + 1] {
        let found = check(&history(&[fence, fence + 7_000, not_above]), &Acknowledged::default());
        assert_eq!(found.of(Violation::FenceNotIncreasing), 1, "{found}");
        assert_eq!(found.total(), 1, "{found}");
    }
}

/// A crash ends a fast lease before its expiry: a grant on the restarted server may come before
/// that expiry, on the same server it may not, and a durable lease survives the restart.
#[test]
fn the_checker_lets_a_restart_end_a_fast_lease_and_nothing_else() {
    let overlaps = |first_durable: bool, second_on_server: i64| {
        let change = |fence: i64, acquired_us: i64, durable: bool, server_start_us: i64| LeaseChange {
            key: "key-0".into(),
            fence,
            kind: LeaseChangeKind::Grant,
            acquired_us,
            expires_us: acquired_us + 60_000_000,
            by: "torture-client-0".into(),
            committed_us: acquired_us + 1,
            durable,
            server_start_us,
        };
        let leases =
            vec![change(10, 1_000_000, first_durable, 1), change(20, 2_000_000, true, second_on_server)];
        let history = History { leases, writes: Vec::new(), final_fences: vec![("key-0".to_string(), 20)] };
        check(&history, &Acknowledged::default()).of(Violation::OverlappingLeases)
    };
    assert_eq!(overlaps(false, 2), 0, "a fast lease ended by a restart");
    assert_eq!(overlaps(false, 1), 1, "a fast lease on the same server");
    assert_eq!(overlaps(true, 2), 1, "a durable lease across a restart");
}

/// A grant that marks the other kind's expired lease ended, in its own transaction, changes no
/// holder's lease; a client's end that moves the current lease's end earlier does.
#[test]
fn the_checker_lets_a_grant_end_an_expired_lease_of_the_other_kind() {
    let change =
        |fence: i64, kind: LeaseChangeKind, expires_us: i64, by: &str, committed_us: i64| LeaseChange {
            key: "key-0".into(),
            fence,
            kind,
            acquired_us: 1_000_000,
            expires_us,
            by: by.into(),
            committed_us,
            durable: true,
            server_start_us: 1,
        };
    let foreign_changes = |end_at: i64| {
        let leases = vec![
            change(10, LeaseChangeKind::Grant, 1_500_000, "torture-client-0", 1_000_001),
            change(10, LeaseChangeKind::End, end_at, "torture-client-1", 2_000_000),
            change(20, LeaseChangeKind::Grant, 9_000_000, "torture-client-1", 2_000_000),
        ];
        let history = History { leases, writes: Vec::new(), final_fences: vec![("key-0".to_string(), 20)] };
        check(&history, &Acknowledged::default()).of(Violation::ForeignChange)
    };
    assert_eq!(foreign_changes(1_500_000), 0, "the expired lease's end left where it was");
    assert_eq!(foreign_changes(1_200_000), 1, "another client moved the lease's end");
}

/// A fast grant the client was told about may vanish with its record in a crash; no later grant
/// may then get a fence at or below it.
#[test]
fn the_checker_lets_a_crash_take_a_fast_grant_but_not_its_fence() {
    let violations = |later_fence: i64| {
        let later = LeaseChange {
            key: "key-0".into(),
            fence: later_fence,
            kind: LeaseChangeKind::Grant,
            acquired_us: 5_000_000,
            expires_us: 6_000_000,
            by: "torture-client-1".into(),
            committed_us: 5_000_001,
            durable: true,
            server_start_us: 2,
        };
        let history = History {
            leases: vec![later],
            writes: Vec::new(),
            final_fences: vec![("key-0".to_string(), later_fence)],
        };
        let mut acked = Acknowledged::default();
        acked.grants.push(AckedGrant {
            key: "key-0".into(),
            fence: 100,
            acquired_us: 1_000_000,
            durable: false,
        });
        let found = check(&history, &acked);
        (found.of(Violation::AcknowledgedLeaseLost), found.of(Violation::FenceNotIncreasing))
    };
    assert_eq!(violations(200), (0, 0), "a fast grant lost in a crash, its fence not reissued");
    assert_eq!(violations(50), (0, 1), "a lower fence granted after it");
    assert_eq!(violations(100), (1, 0), "its fence handed out again (to another acquired_at)");
}
