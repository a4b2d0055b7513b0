//! The torture run, short enough for CI: 8 clients on 6 keys take exclusive leases (alone and in
//! lease sets), shared leases and semaphore permits, write under their fences, renew and release,
//! through pauses past the TTL, connections cut mid-call, terminated backends and kill -9 of the
//! server (2-3 times), then the history checker (src/torture.rs) looks for any violation of
//! pg_fence's invariants. TORTURE_SECONDS sets the workload's length (default 90);
//! `pg_test/run-torture` runs it for longer. The checker's own tests feed it made-up histories.
use pg_fence_integration::torture::{
    self, check, AckedGrant, AckedRenewal, Acknowledged, History, LeaseChange, LeaseChangeKind,
    RecordedWrite, Violation, Workload,
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
    let settings = [
        "track_commit_timestamp=on",
        "wal_writer_delay=10s",
        "wal_writer_flush_after=1GB",
        // Fast leases in shared memory (pg_fence.fast_leases' default), recorded by
        // pg_fence.trace_fast_changes (src/torture/recording.rs).
        "shared_preload_libraries=pg_fence",
    ];
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
    // Every mode, and holders that meet: else the rules of invariant 2 are checked on nothing.
    for (mode, grants, writes) in [
        ("exclusive", counts.grants_by_mode.exclusive, counts.writes_by_mode.exclusive),
        ("shared", counts.grants_by_mode.shared, counts.writes_by_mode.shared),
        ("permits", counts.grants_by_mode.permits, counts.writes_by_mode.permits),
        ("in sets", counts.grants_by_mode.in_sets, counts.writes_by_mode.in_sets),
    ] {
        assert!(grants >= 50 && writes >= 50, "too few {mode} leases: {grants} grants, {writes} writes");
    }
    assert!(counts.sets >= 20, "too few lease sets");
    assert!(counts.most_at_once.shared >= 2, "shared leases never met");
    assert!(counts.most_at_once.permits >= 2, "a semaphore's permits never met");
}

/// A made-up grant of key-0 for the checker's tests (no server): exclusive, durable, in slot 0, by
/// client 0 on the server started at 1, committed 1 µs after it was acquired. Tests change what
/// they need with `LeaseChange { .., ..granted(..) }`.
fn granted(fence: i64, acquired_us: i64, expires_us: i64) -> LeaseChange {
    LeaseChange {
        key: "key-0".into(),
        slot: 0,
        shared: false,
        permits: 1,
        fence,
        kind: LeaseChangeKind::Grant,
        acquired_us,
        expires_us,
        by: "torture-client-0".into(),
        committed_us: acquired_us + 1,
        durable: true,
        server_start_us: 1,
    }
}

/// A shared grant of key-0 in `slot`.
fn shared(fence: i64, slot: i32, acquired_us: i64, expires_us: i64) -> LeaseChange {
    LeaseChange { slot, shared: true, ..granted(fence, acquired_us, expires_us) }
}

/// A grant of one of `permits` permits of key-0, in `slot`.
fn permit(fence: i64, slot: i32, permits: i32, acquired_us: i64, expires_us: i64) -> LeaseChange {
    LeaseChange { slot, permits, ..granted(fence, acquired_us, expires_us) }
}

/// A write under `fence` of key-0, committed at `committed_us`.
fn written(fence: i64, committed_us: i64) -> RecordedWrite {
    RecordedWrite { key: "key-0".into(), fence, write_id: committed_us, committed_us }
}

/// The history of these changes and writes; the lease tables end with the highest fence.
fn history(leases: Vec<LeaseChange>, writes: Vec<RecordedWrite>) -> History {
    let last = leases.iter().map(|change| change.fence).max().unwrap_or(0);
    History { leases, writes, final_fences: vec![("key-0".to_string(), last)] }
}

/// The violations of a history, with nothing acknowledged.
fn violations_of(leases: Vec<LeaseChange>, writes: Vec<RecordedWrite>) -> torture::Violations {
    check(&history(leases, writes), &Acknowledged::default())
}

/// The checker judges fences by their order alone, as pg_fence promises them: grants of clock-sized
/// fences with gaps between them pass, and a grant not above the previous one is caught, whether it
/// repeats a fence or goes below it; across slots and modes too. (No server: a history made up here.)
#[test]
fn the_checker_orders_fences_without_counting_them() {
    let in_order = |fences: &[i64], shared_from: usize| {
        let leases = fences
            .iter()
            .zip(0..)
            .map(|(&fence, i)| {
                let at = 1_000_000 + i * 1_000;
                LeaseChange {
                    slot: i as i32,
                    shared: i as usize >= shared_from,
                    ..granted(fence, at, at + 100)
                }
            })
            .collect();
        violations_of(leases, Vec::new())
    };
    let fence = 1_796_126_851_580_275;
    for shared_from in [usize::MAX, 2] {
        let increasing = in_order(&[fence, fence + 1, fence + 7_000, fence + 7_001], shared_from);
        assert_eq!(increasing.total(), 0, "{increasing}");
        for not_above in [fence + 7_000, fence + 1] {
            let found = in_order(&[fence, fence + 7_000, not_above], shared_from);
            assert_eq!(found.of(Violation::FenceNotIncreasing), 1, "{found}");
            assert_eq!(found.total(), 1, "{found}");
        }
    }
}

/// A crash ends a fast lease before its expiry: a grant on the restarted server may come before
/// that expiry, on the same server it may not, and a durable lease survives the restart.
#[test]
fn the_checker_lets_a_restart_end_a_fast_lease_and_nothing_else() {
    let overlaps = |first_durable: bool, second_on_server: i64, second_shared: bool| {
        let first = LeaseChange { durable: first_durable, ..granted(10, 1_000_000, 61_000_000) };
        let second = LeaseChange {
            slot: 1,
            shared: second_shared,
            server_start_us: second_on_server,
            ..granted(20, 2_000_000, 62_000_000)
        };
        let found = violations_of(vec![first, second], Vec::new());
        found.of(Violation::TooManyLive) + found.of(Violation::SharedBesideOther)
    };
    for shared in [false, true] {
        assert_eq!(overlaps(false, 2, shared), 0, "a fast lease ended by a restart");
        assert_eq!(overlaps(false, 1, shared), 1, "a fast lease on the same server");
        assert_eq!(overlaps(true, 2, shared), 1, "a durable lease across a restart");
    }
}

/// A grant that marks another row's expired lease ended (another slot's, or the other kind's), in
/// its own transaction, changes no holder's lease; a client's end that moves the current lease's
/// end earlier does, and so does a change of a row whose current lease has another fence.
#[test]
fn the_checker_lets_a_grant_end_an_expired_lease_of_another_row() {
    let foreign_changes = |end_at: i64, end_slot: i32, granted_in: LeaseChange| {
        let end = LeaseChange {
            kind: LeaseChangeKind::End,
            slot: end_slot,
            by: "torture-client-1".into(),
            committed_us: 2_000_000,
            ..granted(10, 1_000_000, end_at)
        };
        let grant =
            LeaseChange { fence: 20, by: "torture-client-1".into(), committed_us: 2_000_000, ..granted_in };
        violations_of(vec![granted(10, 1_000_000, 1_500_000), end, grant], Vec::new())
            .of(Violation::ForeignChange)
    };
    let another_slot = LeaseChange { slot: 1, permits: 3, ..granted(0, 1_999_999, 9_000_000) };
    let other_kind = LeaseChange { durable: false, ..granted(0, 1_999_999, 9_000_000) };
    for grant in [another_slot, other_kind] {
        assert_eq!(
            foreign_changes(1_500_000, 0, grant.clone()),
            0,
            "the expired lease's end left where it was"
        );
        assert_eq!(foreign_changes(1_200_000, 0, grant.clone()), 1, "another client moved the lease's end");
        assert_eq!(foreign_changes(1_500_000, 1, grant), 1, "fence 10 ended in a row it never had");
    }
}

/// Each holder of a key has a row of its own: renewals and releases of the holders of several
/// slots interleave, each changing its own row's lease; another client's renewal of a holder's
/// lease is foreign.
#[test]
fn the_checker_keeps_the_rows_of_a_key_apart() {
    let foreign_changes = |renewed_by: &str| {
        let by = |client: &str, change: LeaseChange| LeaseChange { by: client.into(), ..change };
        let later = |kind, committed_us, change: LeaseChange| LeaseChange { kind, committed_us, ..change };
        let (first, second) =
            (permit(10, 0, 3, 1_000_000, 2_000_000), permit(11, 1, 3, 1_100_000, 2_000_000));
        let second = by("torture-client-1", second);
        let leases = vec![
            first.clone(),
            second.clone(),
            later(
                LeaseChangeKind::Renew,
                1_200_000,
                by(renewed_by, LeaseChange { expires_us: 2_500_000, ..first }),
            ),
            later(LeaseChangeKind::End, 1_300_000, LeaseChange { expires_us: 1_300_000, ..second }),
        ];
        violations_of(leases, Vec::new()).of(Violation::ForeignChange)
    };
    assert_eq!(foreign_changes("torture-client-0"), 0, "each holder changed its own lease");
    assert_eq!(foreign_changes("torture-client-1"), 1, "the holder of slot 1 renewed slot 0's lease");
}

/// A fast grant the client was told about may vanish with its record in a crash; no later grant
/// may then get a fence at or below it.
#[test]
fn the_checker_lets_a_crash_take_a_fast_grant_but_not_its_fence() {
    let violations = |later_fence: i64| {
        let later = LeaseChange {
            by: "torture-client-1".into(),
            server_start_us: 2,
            ..granted(later_fence, 5_000_000, 6_000_000)
        };
        let mut acked = Acknowledged::default();
        acked.grants.push(AckedGrant {
            key: "key-0".into(),
            fence: 100,
            acquired_us: 1_000_000,
            durable: false,
            shared: false,
            permits: 1,
        });
        let found = check(&history(vec![later], Vec::new()), &acked);
        (found.of(Violation::AcknowledgedLeaseLost), found.of(Violation::FenceNotIncreasing))
    };
    assert_eq!(violations(200), (0, 0), "a fast grant lost in a crash, its fence not reissued");
    assert_eq!(violations(50), (0, 1), "a lower fence granted after it");
    assert_eq!(violations(100), (1, 0), "its fence handed out again (to another acquired_at)");
}

/// Shared leases stand beside each other, never beside an exclusive lease or a permit, whichever
/// came first; a lease that ended at the instant the other was acquired is not beside it.
#[test]
fn the_checker_finds_a_shared_lease_beside_another_mode() {
    // Two readers, from 1.0 s and 1.1 s to 2.0 s, and `other`; fences in the order of acquisition.
    let with_readers = |other: LeaseChange| {
        let readers = [shared(0, 0, 1_000_000, 2_000_000), shared(0, 1, 1_100_000, 2_000_000)];
        let mut leases: Vec<LeaseChange> = readers.into_iter().chain([other]).collect();
        leases.sort_by_key(|change| change.acquired_us);
        leases.iter_mut().for_each(|change| change.fence = change.acquired_us);
        violations_of(leases, Vec::new())
    };
    let found = with_readers(shared(0, 2, 1_500_000, 3_000_000));
    assert_eq!(found.total(), 0, "a third reader: {found}");
    let found = with_readers(LeaseChange { slot: 2, ..granted(0, 2_000_000, 3_000_000) });
    assert_eq!(found.total(), 0, "a writer acquired as the readers' leases ended: {found}");
    for (other, what) in [
        (granted(0, 1_500_000, 3_000_000), "a writer after the readers"),
        (granted(0, 500_000, 1_050_000), "a writer before the readers, still live at the first"),
        (permit(0, 2, 3, 1_900_000, 3_000_000), "a permit after the readers"),
    ] {
        let found = with_readers(other);
        assert_eq!(found.of(Violation::SharedBesideOther), 1, "{what}: {found}");
        assert_eq!(found.total(), 1, "{what}: {found}");
    }
}

/// At most N permits of a semaphore of N live at once; callers that disagree about N are held to the
/// smallest count among the live permits; an exclusive lease is a semaphore of one.
#[test]
fn the_checker_counts_live_permits_against_the_smallest_count() {
    let too_many = |counts: &[i32]| {
        let leases = counts
            .iter()
            .zip(0..)
            .map(|(&permits, i)| permit(10 + i as i64, i, permits, 1_000_000 + i as i64 * 1_000, 2_000_000))
            .collect();
        let found = violations_of(leases, Vec::new());
        assert_eq!(found.total(), found.of(Violation::TooManyLive), "{found}");
        found.of(Violation::TooManyLive)
    };
    assert_eq!(too_many(&[3, 3, 3]), 0, "three permits of three");
    assert_eq!(too_many(&[3, 3, 3, 3]), 1, "a fourth permit of three");
    assert_eq!(too_many(&[3, 2]), 0, "two permits, one of them of two");
    assert_eq!(too_many(&[3, 3, 2]), 1, "a permit of two beside two of three");
    assert_eq!(too_many(&[2, 3, 3]), 1, "two permits of three beside one of two");
    assert_eq!(too_many(&[1, 1]), 1, "two exclusive leases at once");
    assert_eq!(too_many(&[3, 1]), 1, "an exclusive lease beside a permit");
    // Counted at every instant, not per grant: the first permit ended before the fourth came.
    let leases = vec![
        permit(10, 0, 3, 1_000_000, 1_500_000),
        permit(11, 1, 3, 1_100_000, 2_000_000),
        permit(12, 2, 3, 1_200_000, 2_000_000),
        permit(13, 0, 3, 1_500_000, 2_000_000),
    ];
    let found = violations_of(leases, Vec::new());
    assert_eq!(found.total(), 0, "{found}");
}

/// A write under fence F must commit before any grant that replaced F: the next grant of its slot,
/// a grant of the other side of shared and non-shared, or a grant beside an exclusive lease. Not
/// before a shared grant beside a shared lease, nor before another slot's permit.
#[test]
fn the_checker_finds_a_write_after_the_grant_that_replaced_its_lease() {
    let late_writes = |held: LeaseChange, next: LeaseChange| {
        let (held_fence, next_committed) = (held.fence, next.committed_us);
        let writes = vec![written(held_fence, next_committed - 10), written(held_fence, next_committed + 10)];
        let found = violations_of(vec![held, next], writes);
        found.of(Violation::LateWrite)
    };
    let at = |fence: i64| 1_000_000 + fence * 100_000;
    let (reader, writer) = (shared(1, 0, at(1), at(2)), granted(1, at(1), at(2)));
    let one_of_three = permit(1, 1, 3, at(1), at(2));
    assert_eq!(late_writes(writer.clone(), granted(2, at(2), at(3))), 1, "exclusive after exclusive");
    assert_eq!(late_writes(reader.clone(), shared(2, 1, at(2), at(3))), 0, "a reader beside a reader");
    assert_eq!(late_writes(reader.clone(), shared(2, 0, at(2), at(3))), 0, "a reader in a reader's slot");
    assert_eq!(
        late_writes(reader, LeaseChange { slot: 1, ..granted(2, at(2), at(3)) }),
        1,
        "writer after reader"
    );
    assert_eq!(late_writes(writer, shared(2, 1, at(2), at(3))), 1, "reader after writer");
    assert_eq!(late_writes(one_of_three.clone(), permit(2, 2, 3, at(2), at(3))), 0, "another slot's permit");
    assert_eq!(
        late_writes(one_of_three.clone(), permit(2, 1, 3, at(2), at(3))),
        1,
        "the next permit of its slot"
    );
    assert_eq!(
        late_writes(one_of_three.clone(), permit(2, 0, 2, at(2), at(3))),
        0,
        "a permit of two beside it"
    );
    assert_eq!(
        late_writes(one_of_three.clone(), permit(2, 1, 2, at(2), at(3))),
        1,
        "a permit of two in its slot"
    );
    assert_eq!(late_writes(one_of_three.clone(), granted(2, at(2), at(3))), 1, "an exclusive lease after it");
    assert_eq!(late_writes(one_of_three, shared(2, 0, at(2), at(3))), 1, "a reader after it");
    let unknown = violations_of(vec![granted(1, at(1), at(2))], vec![written(2, at(3))]);
    assert_eq!(unknown.of(Violation::LateWrite), 1, "a write under a fence never granted: {unknown}");
}

/// An acknowledged grant is recorded in the mode the client asked for; a set's acknowledged renewal
/// (lease_renew_all returns the earliest new expiry of its keys) is recorded at or after it.
#[test]
fn the_checker_holds_acknowledgements_to_their_mode_and_renewals_of_sets_to_their_expiry() {
    let renewal = LeaseChange {
        kind: LeaseChangeKind::Renew,
        committed_us: 1_500_000,
        ..granted(10, 1_000_000, 3_000_123)
    };
    let recorded = history(
        vec![shared(10, 0, 1_000_000, 2_000_000), LeaseChange { shared: true, ..renewal }],
        Vec::new(),
    );
    let with = |shared: bool, permits: i32, expires_us: i64, at_least: bool| {
        let mut acked = Acknowledged::default();
        let (key, fence) = ("key-0".to_string(), 10);
        acked.grants.push(AckedGrant {
            key: key.clone(),
            fence,
            acquired_us: 1_000_000,
            durable: true,
            shared,
            permits,
        });
        acked.renewals.push(AckedRenewal { key, fence, expires_us, at_least });
        let found = check(&recorded, &acked);
        (found.of(Violation::WrongMode), found.of(Violation::AcknowledgedLeaseLost))
    };
    assert_eq!(with(true, 1, 3_000_123, false), (0, 0), "as asked");
    assert_eq!(with(false, 1, 3_000_123, false), (1, 0), "asked exclusive, recorded shared");
    assert_eq!(with(false, 3, 3_000_123, false), (1, 0), "asked a permit, recorded shared");
    assert_eq!(with(true, 1, 3_000_000, true), (0, 0), "a set's renewal to at least its earliest expiry");
    assert_eq!(with(true, 1, 3_000_000, false), (0, 1), "a single renewal is recorded exactly");
    assert_eq!(with(true, 1, 3_000_200, true), (0, 1), "a set's renewal recorded short of its expiry");
}
