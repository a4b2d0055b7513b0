//! pg_fence through a step of the server's wall clock, such as an NTP correction or a resumed VM
//! makes. The server runs under libfaketime with an offset the test rewrites, while CLOCK_MONOTONIC
//! keeps running (FAKETIME_DONT_FAKE_MONOTONIC), as it does through a real step.
//!
//! - How long a wait lasts is measured on the monotonic clock: a step back must not stretch it. A
//!   deadline on the wall clock would make a 3 s wait last 23 s after a 20 s step back.
//! - Liveness is judged by the wall clock, the clock every `acquired_at` and `expires_at` is written
//!   in. So a step forward ends leases early, and a step back makes an expired lease live again as
//!   long as nobody took the key in between. A lease that was taken over stays lost whatever the
//!   clock does, because its token no longer holds the key and its fence is no longer the current
//!   one. docs/guarantees.md ("Clock steps") states all of this, and the second test pins it down.
//!
//! - Fences are greatest(previous + 1, clock): a step back makes them go on from the previous one,
//!   never below it, and a key whose row the sweep deleted starts above the deleted fences
//!   (fence.high_water), not at the clock, which may now be behind them. The third test.
//!
//! After every step the test reads the server's clock to check that the step happened. If
//! libfaketime were not loaded (say the environment stopped reaching the postmaster), the wait test
//! would otherwise pass without testing anything.
use pg_fence_integration::fake_clock::{server_offset, FakeClock};
use pg_fence_integration::{
    acquire, backend_pid, comes_to_wait_on, edition, skipped_on_the_sql_edition, sqlstate, wait_until_past,
    Acquire, Edition, Lease,
};
use postgres::Client;
use std::thread;
use std::time::{Duration, Instant};

/// lease_renew with a 5-second TTL: Ok, or the SQLSTATE it failed with.
fn renew(client: &mut Client, lease: &Lease) -> Result<(), String> {
    lease.renew(client, "5 seconds").map(drop).map_err(|err| sqlstate(&err))
}

/// fence_guard: Ok (it returned true), or the SQLSTATE it failed with.
fn guard(client: &mut Client, key: &str, fence: i64) -> Result<(), String> {
    let row = client
        .query_one("SELECT fence.fence_guard($1, $2)", &[&key, &fence])
        .map_err(|err| sqlstate(&err))?;
    assert!(row.get::<_, bool>(0), "fence_guard returns true or raises");
    Ok(())
}

/// The key's row in fence.leases: (fence, live).
fn lease(client: &mut Client, key: &str) -> (i64, bool) {
    let row = client.query_one("SELECT fence, live FROM fence.leases WHERE key = $1", &[&key]).unwrap();
    (row.get(0), row.get(1))
}

/// A 3-second wait for a held key, during which the server's clock steps back 20 s: it must still
/// end after 3 s, not after the 23 s a deadline on the wall clock would take.
#[test]
fn a_wait_runs_on_the_monotonic_clock() {
    if skipped_on_the_sql_edition(
        "its waiter sleeps in pg_sleep, which PostgreSQL counts on the wall clock: a step back during one of its \
         10 ms sleeps stretches that sleep by the step (the wait itself is counted step-proof, sql/edition/acquire.sql)",
    ) {
        return;
    }
    let clock = FakeClock::new("clock_wait");
    let cluster = clock.start_cluster("clock_wait", 26951, &[]);
    let (mut a, mut observer) = (cluster.connect(), cluster.connect());
    acquire(&mut a, "clock:wait", "1 hour").expect("the key is free");

    let mut b = cluster.connect();
    let b_pid = backend_pid(&mut b);
    let started = Instant::now();
    let waiter = thread::spawn(move || {
        let start = Instant::now();
        let lease = Acquire::new("clock:wait", "1 minute").wait("3 seconds").run(&mut b);
        (lease.map(|lease| lease.fence), start.elapsed())
    });
    // The step must come after B has set its deadline, that is while it sleeps on its latch.
    assert!(comes_to_wait_on(&mut observer, b_pid, "Extension"), "B never went to sleep waiting for the key");
    thread::sleep(Duration::from_millis(500).saturating_sub(started.elapsed()));
    clock.step(&mut observer, -20);

    let (fence, elapsed) = waiter.join().unwrap();
    println!("a 3 s wait with a 20 s step back of the server's clock took {elapsed:.3?}");
    assert_eq!(fence, None, "A still holds the key for an hour");
    assert!(elapsed >= Duration::from_secs(3), "the wait ended early: {elapsed:?}");
    assert!(elapsed < Duration::from_secs(10), "the step back stretched the wait: {elapsed:?}");
}

/// What a step of the server's clock does to a lease, exactly as docs/guarantees.md ("Clock steps") states it.
#[test]
fn a_step_forward_expires_leases_and_a_step_back_revives_an_untaken_one() {
    const KEY: &str = "clock:step";
    let clock = FakeClock::new("clock_step");
    let cluster = clock.start_cluster("clock_step", 26952, &[]);
    let (mut a, mut b, mut observer) = (cluster.connect(), cluster.connect(), cluster.connect());
    // Each step below is seconds of real time from the last grant or renewal at most, well within
    // the 5-second TTL.
    let a_lease = acquire(&mut a, KEY, "5 seconds").expect("the key is free");
    let fence = a_lease.fence;

    // Forward past the TTL: by the server's clock, the lease has expired.
    clock.step(&mut observer, 10);
    assert_eq!(renew(&mut a, &a_lease), Err("PF001".into()));
    assert_eq!(guard(&mut a, KEY, fence), Err("PF002".into()));
    assert_eq!(lease(&mut observer, KEY), (fence, false));

    // Back, with no grant in between: the lease row is unchanged and live again by the server's
    // clock, so A's fence passes the guard and its renewal succeeds. This is documented behaviour
    // (docs/guarantees.md), not a bug: nobody else can have held the key, and nobody can get it while it is live.
    clock.step(&mut observer, 0);
    assert_eq!(lease(&mut observer, KEY), (fence, true));
    assert_eq!(guard(&mut a, KEY, fence), Ok(()));
    assert_eq!(renew(&mut a, &a_lease), Ok(()), "the untaken lease is live again");

    // Forward again, and this time B takes the key over.
    clock.step(&mut observer, 10);
    let b_fence =
        acquire(&mut b, KEY, "1 minute").expect("A's lease has expired by the server's clock").fence;
    assert!(b_fence > fence, "the takeover got fence {b_fence}, not above {fence}");

    // Back: a lease taken over is never revived, whatever the clock does.
    clock.step(&mut observer, 0);
    assert_eq!(renew(&mut a, &a_lease), Err("PF001".into()));
    assert_eq!(guard(&mut a, KEY, fence), Err("PF002".into()));
    assert_eq!(lease(&mut observer, KEY), (b_fence, true), "B's lease is live");
}

/// Steps back and forth by up to minutes while keys are granted, released, and (with
/// pg_fence.retain_ended = 0) deleted by sweeps: every key's fences strictly increase, and each
/// grant leaves exactly one live lease. The deleted keys are granted again after steps back to
/// before their last grant, so only the high-water mark can keep their fences rising.
#[test]
fn fences_strictly_increase_through_clock_steps_and_deletions() {
    const KEYS: usize = 4;
    let clock = FakeClock::new("clock_fences");
    let cluster = clock.start_cluster("clock_fences", 26953, &["pg_fence.retain_ended=0"]);
    let (mut client, mut observer) = (cluster.connect(), cluster.connect());
    let mut last = [i64::MIN; KEYS];
    let mut deleted_regrants = 0;
    for offset in [0, -30, 15, -90, -60, 40, -200, -199, 0, -5] {
        clock.step(&mut observer, offset);
        for (k, last) in last.iter_mut().enumerate() {
            let key = format!("clock:fence:{k}");
            let had_row = client
                .query_one("SELECT count(*) FROM fence.lease_state WHERE key = $1", &[&key])
                .unwrap()
                .get::<_, i64>(0)
                == 1;
            let lease = acquire(&mut client, &key, "1 hour").expect("the key was released");
            let fence = lease.fence;
            assert!(fence > *last, "{key} at {offset:+} s: fence {fence} after {last}");
            deleted_regrants += usize::from(!had_row && *last != i64::MIN);
            *last = fence;
            let live: i64 = observer
                .query_one("SELECT count(*) FROM fence.leases WHERE key = $1 AND live", &[&key])
                .unwrap()
                .get(0);
            assert_eq!(live, 1, "{key} at {offset:+} s");
            assert!(lease.release(&mut client));
        }
        // Every key loses its row: released just now, each ended before this sweep read the clock.
        thread::sleep(Duration::from_millis(5));
        client.query_one("SELECT fence.sweep()", &[]).unwrap();
    }
    println!("{deleted_regrants} grants of keys whose rows the sweep had deleted");
    assert!(deleted_regrants > 0, "no key was granted again after its row was deleted");
}

/// A REPEATABLE READ transaction whose snapshot predates both the first grant of a key and the
/// sweep that deleted the key's row again: its acquire of the key finds no row, and its snapshot's
/// high-water mark is older than the deleted fence. With the clock stepped back behind that fence,
/// only the mark as last committed, which every grant reads, keeps it from handing that fence out
/// again.
#[test]
fn a_repeatable_read_acquire_never_reissues_a_fence_deleted_after_its_snapshot() {
    const KEY: &str = "clock:rr";
    let clock = FakeClock::new("clock_rr");
    let cluster = clock.start_cluster("clock_rr", 26954, &["pg_fence.retain_ended=0"]);
    let (mut client, mut observer) = (cluster.connect(), cluster.connect());
    let release_and_sweep = |client: &mut Client, lease: Lease| {
        lease.release(client);
        thread::sleep(Duration::from_millis(5));
        client.query_one("SELECT fence.sweep()", &[]).unwrap();
    };
    // A first high-water mark, from another key, then the clock far behind it.
    let other = acquire(&mut client, "clock:rr:other", "1 hour").unwrap();
    let mark = other.fence;
    release_and_sweep(&mut client, other);
    clock.step(&mut observer, -120);

    let mut old = cluster.connect();
    old.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1").unwrap();
    let lease = acquire(&mut client, KEY, "1 hour").unwrap();
    let deleted = lease.fence;
    assert!(deleted > mark, "a key without a row starts above the high-water mark");
    release_and_sweep(&mut client, lease);
    let rows: i64 =
        client.query_one("SELECT count(*) FROM fence.lease_state WHERE key = $1", &[&KEY]).unwrap().get(0);
    assert_eq!(rows, 0, "the sweep did not delete the key's row");

    let granted = Acquire::new(KEY, "1 hour").try_run(&mut old);
    if edition() == Edition::Sql {
        // The SQL edition cannot read the mark past its snapshot: a mark raised since is a
        // serialization failure (tests/regress/sql-edition/README.md).
        let err = granted.expect_err("the old snapshot's acquire on the SQL edition");
        assert_eq!(sqlstate(&err), "40001", "{err}");
        old.batch_execute("ROLLBACK").unwrap();
        let fence = acquire(&mut client, KEY, "1 hour").expect("the key is free").fence;
        assert!(fence > deleted, "retried in READ COMMITTED: fence {fence}, not above {deleted}");
        return;
    }
    let granted = granted.expect("the key is free").expect("granted");
    assert!(
        granted.fence > deleted,
        "the old snapshot's acquire got fence {}; {deleted} was deleted after it",
        granted.fence
    );
    old.batch_execute("ROLLBACK").unwrap();
    let fence = acquire(&mut client, KEY, "1 hour").expect("the key is free").fence;
    assert!(fence > deleted, "retried in READ COMMITTED: fence {fence}, not above {deleted}");
}

/// A lease that expired unreleased stays ended once the other kind has granted the key: a step
/// back of the clock to before its expiry does not make it live beside the new lease.
#[test]
fn a_step_back_revives_no_lease_the_other_kind_took_over() {
    let clock = FakeClock::new("clock_kinds");
    let cluster = clock.start_cluster("clock_kinds", 26955, &[]);
    let mut client = cluster.connect();
    for (first_durable, key) in [(true, "durable-then-fast"), (false, "fast-then-durable")] {
        let old = Acquire::new(key, "1 second").durable(first_durable).run(&mut client).unwrap();
        wait_until_past(&mut client, old.expires_at);
        let new = Acquire::new(key, "1 hour").durable(!first_durable).run(&mut client).expect("expired");
        clock.step(&mut client, -30);
        assert_eq!(renew(&mut client, &old), Err("PF001".into()), "{key}: the expired lease");
        assert_eq!(guard(&mut client, key, old.fence), Err("PF002".into()), "{key}: the expired lease");
        assert_eq!(renew(&mut client, &new), Ok(()), "{key}: the new lease");
        assert_eq!(guard(&mut client, key, new.fence), Ok(()), "{key}: the new lease");
        clock.step(&mut client, 0);
    }
}

/// After a step back, a key's fences run ahead of the clock (each the previous + 1); a crash then
/// forgets the fast leases, and the clock alone would put the next grant below their fences.
#[test]
fn a_crash_after_a_step_back_hands_out_no_fast_fence_again() {
    let clock = FakeClock::new("clock_fast_crash");
    let cluster = clock.start_cluster("clock_fast_crash", 26956, &[]);
    let mut client = cluster.connect();
    // "only-fast" has only ever been granted fast; "mixed" also has a durable row, of a lower fence.
    Acquire::new("mixed", "1 hour").durable(true).run(&mut client).unwrap().release(&mut client);
    let mut told = Vec::new();
    for key in ["only-fast", "mixed"] {
        let lease = Acquire::new(key, "1 hour").durable(false).run(&mut client).unwrap();
        lease.release(&mut client);
        told.push((key, lease.fence));
    }
    clock.step(&mut client, -3600);
    for key in ["only-fast", "mixed"] {
        let fence = Acquire::new(key, "1 hour").durable(false).run(&mut client).unwrap().fence;
        told.push((key, fence));
    }
    cluster.crash();
    clock.restart(&cluster);
    let mut client = cluster.connect();
    assert!(server_offset(&mut client) < -3000.0, "the restarted server's clock is not stepped back");
    for (key, durable) in [("only-fast", true), ("mixed", true), ("only-fast", false), ("mixed", false)] {
        let lease =
            Acquire::new(key, "1 hour").durable(durable).run(&mut client).expect("the crash ended it");
        let fence = lease.fence;
        let highest = told.iter().filter(|(k, _)| *k == key).map(|(_, f)| *f).max().unwrap();
        assert!(fence > highest, "{key}: granted {fence} (durable: {durable}) after {highest} was told");
        lease.release(&mut client);
        told.push((key, fence));
    }
}

/// A key's two rows are deleted one at a time (by their own end, which a step of the clock can
/// order either way): the grant of the kind whose row stayed must start above the deleted row's
/// fence, held now only by the high-water mark, though the clock has stepped back behind it.
#[test]
fn a_grant_starts_above_the_other_kinds_deleted_fence() {
    let clock = FakeClock::new("clock_deleted_other");
    // Rows of leases that ended more than 30 s ago are deleted; younger ones stay.
    let cluster = clock.start_cluster("clock_deleted_other", 26957, &["pg_fence.retain_ended=30"]);
    let mut client = cluster.connect();
    for (kept_durable, key) in [(false, "fast-kept"), (true, "durable-kept")] {
        // The kept row's lease ends at the real time; the other's, granted after it with the
        // clock 60 s back, ends 60 s earlier by the clock, so the sweep deletes it first.
        let kept = Acquire::new(key, "1 hour").durable(kept_durable).run(&mut client).unwrap();
        kept.release(&mut client);
        clock.step(&mut client, -60);
        let deleted = Acquire::new(key, "1 hour").durable(!kept_durable).run(&mut client).unwrap();
        assert!(deleted.fence > kept.fence);
        deleted.release(&mut client);
        clock.step(&mut client, 0);
        client.query_one("SELECT fence.sweep()", &[]).unwrap();
        let (durable_rows, fast_rows): (i64, i64) = {
            let row = client
                .query_one(
                    "SELECT (SELECT count(*) FROM fence.lease_state WHERE key = $1),
                            (SELECT count(*) FROM fence.fast_lease_rows() WHERE key = $1)",
                    &[&key],
                )
                .unwrap();
            (row.get(0), row.get(1))
        };
        assert_eq!((durable_rows, fast_rows), (i64::from(kept_durable), i64::from(!kept_durable)), "{key}");
        clock.step(&mut client, -60);
        let again = Acquire::new(key, "1 hour").durable(kept_durable).run(&mut client).unwrap();
        assert!(
            again.fence > deleted.fence,
            "{key}: granted {} after {} was told",
            again.fence,
            deleted.fence
        );
        again.release(&mut client);
        clock.step(&mut client, 0);
    }
}

/// A fast lease granted at the clock, a step back, then a crash: the crash forgets the fast lease,
/// and the clock is behind its fence; the next grant of the key, of either kind, must still be
/// above it (the fast reservation, src/leases/state/fences.rs).
#[test]
fn a_crash_after_a_step_back_forgets_no_fast_fence_granted_at_the_clock() {
    let clock = FakeClock::new("clock_fast_reserve");
    let cluster = clock.start_cluster("clock_fast_reserve", 26958, &[]);
    let mut client = cluster.connect();
    let mut told = Vec::new();
    for key in ["then-durable", "then-fast"] {
        told.push(Acquire::new(key, "1 hour").durable(false).run(&mut client).unwrap().fence);
    }
    clock.step(&mut client, -600);
    cluster.crash();
    clock.restart(&cluster);
    let mut client = cluster.connect();
    assert!(server_offset(&mut client) < -500.0, "the restarted server's clock is not stepped back");
    for ((key, durable), told) in [("then-durable", true), ("then-fast", false)].into_iter().zip(told) {
        let fence = Acquire::new(key, "1 hour").durable(durable).run(&mut client).expect("crash").fence;
        assert!(fence > told, "{key}: granted {fence} (durable: {durable}) after {told} was told");
    }
}

/// A fast grant that takes over an expired, unreleased durable lease ends it in the durable row. A
/// crash right after, and a restart with the clock back before that lease's expiry: the old lease
/// must stay ended, not renew and pass its guard beside the new holder.
#[test]
fn a_durable_lease_a_fast_grant_took_over_stays_lost_after_a_crash() {
    const KEY: &str = "clock:taken-over";
    let clock = FakeClock::new("clock_taken_over");
    // The WAL writer flushes an asynchronous commit within wal_writer_delay: keep it from doing so
    // before the crash.
    let cluster = clock.start_cluster("clock_taken_over", 26959, &["wal_writer_delay=10s"]);
    let mut client = cluster.connect();
    let old = Acquire::new(KEY, "2 seconds").run(&mut client).unwrap();
    wait_until_past(&mut client, old.expires_at);
    // A fast grant of another key, just before, reserves fast fences ahead of the clock (by 2 s) and
    // flushes; the takeover's own fence is then covered, so nothing but the takeover itself can make
    // its commit flush.
    Acquire::new("clock:warm-up", "1 hour").durable(false).run(&mut client).unwrap();
    let new = Acquire::new(KEY, "1 hour").durable(false).run(&mut client).expect("the old lease expired");
    assert!(new.fence > old.fence);
    cluster.crash();
    clock.write(-10);
    clock.restart(&cluster);
    let mut client = cluster.connect();
    assert!(server_offset(&mut client) < -5.0, "the restarted server's clock is not stepped back");
    assert_eq!(renew(&mut client, &old), Err("PF001".into()), "the taken-over lease renewed");
    assert_eq!(
        guard(&mut client, KEY, old.fence),
        Err("PF002".into()),
        "the taken-over lease's guard passed"
    );
}

/// After a crash, every backend's grants start above the fast reservation, not only the first's:
/// a fast lease told before the crash, the clock stepped back before it (or after the restart),
/// and grants of the key in backends that start after another backend's first grant.
#[test]
fn after_a_crash_every_backend_grants_above_the_forgotten_fast_fences() {
    let clock = FakeClock::new("clock_reset_floor");
    let cluster = clock.start_cluster("clock_reset_floor", 26960, &[]);
    for step_back_after_restart in [false, true] {
        let mut client = cluster.connect();
        // "mixed" also has a released durable row, of a lower fence than its fast lease's.
        Acquire::new("mixed", "1 hour").durable(true).run(&mut client).unwrap().release(&mut client);
        let told: Vec<(&str, i64)> = ["only-fast", "mixed"]
            .into_iter()
            .map(|key| (key, Acquire::new(key, "1 hour").durable(false).run(&mut client).unwrap().fence))
            .collect();
        if !step_back_after_restart {
            clock.step(&mut client, -600);
        }
        cluster.crash();
        clock.restart(&cluster);
        // The first grant after the restart, of another key, in a backend of its own.
        Acquire::new("another", "1 second").durable(false).run(&mut cluster.connect()).unwrap();
        let mut client = cluster.connect();
        if step_back_after_restart {
            clock.step(&mut client, -600);
        }
        assert!(server_offset(&mut client) < -500.0, "the clock is not stepped back");
        for ((key, fence), durable) in told.into_iter().zip([false, true]) {
            // Each in a new backend, which finds the reset already marked.
            let lease = Acquire::new(key, "1 hour").durable(durable).run(&mut cluster.connect()).unwrap();
            assert!(
                lease.fence > fence,
                "{key}: granted {} (durable: {durable}) after {fence} was told, {} s below it \
                 (step back after the restart: {step_back_after_restart})",
                lease.fence,
                (fence - lease.fence) / 1_000_000
            );
            lease.release(&mut client);
        }
        clock.step(&mut client, 0);
    }
}
