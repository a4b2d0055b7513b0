//! The sweeper background worker, in a cluster with pg_fence in shared_preload_libraries.
use pg_fence_integration::{
    acquire, edition, eventually, set_fence_setting, skipped_on_the_sql_edition, sqlstate, Acquire, Cluster,
    Edition, WORKER,
};
use postgres::Client;
use std::thread;
use std::time::Duration;

fn worker_pid(client: &mut Client) -> Option<i32> {
    client
        .query_opt("SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_fence sweeper'", &[])
        .unwrap()
        .map(|row| row.get(0))
}

fn unswept(client: &mut Client) -> i64 {
    client
        .query_one("SELECT count(*) FROM fence.lease_state WHERE token_hash IS NOT NULL AND expires_at <= clock_timestamp()", &[])
        .unwrap()
        .get(0)
}

/// The worker runs under its own backend_type, sweeps on its interval, takes a new interval on
/// SIGHUP (it starts with one of an hour), and is restarted after pg_terminate_backend.
#[test]
fn the_sweeper_sweeps_reloads_and_comes_back() {
    if skipped_on_the_sql_edition(WORKER) {
        return;
    }
    let cluster = Cluster::start(
        "sweeper",
        26501,
        &["shared_preload_libraries=pg_fence", "pg_fence.database=postgres", "pg_fence.sweep_interval=1h"],
    );
    let mut client = cluster.connect();
    assert!(eventually(Duration::from_secs(10), || worker_pid(&mut client).is_some()), "no sweeper worker");

    acquire(&mut client, "k", "10 milliseconds");
    thread::sleep(Duration::from_millis(300));
    assert_eq!(unswept(&mut client), 1, "swept before its interval of an hour");

    client.batch_execute("ALTER SYSTEM SET pg_fence.sweep_interval = '100ms'").unwrap();
    client.batch_execute("SELECT pg_reload_conf()").unwrap();
    assert!(
        eventually(Duration::from_secs(5), || unswept(&mut client) == 0),
        "the reloaded interval never took effect"
    );
    let total: i64 = client.query_one("SELECT total_swept FROM fence.sweeper", &[]).unwrap().get(0);
    assert!(total >= 1);

    let pid = worker_pid(&mut client).unwrap();
    client.query_one("SELECT pg_terminate_backend($1)", &[&pid]).unwrap();
    assert!(
        eventually(Duration::from_secs(15), || worker_pid(&mut client).is_some_and(|new| new != pid)),
        "the sweeper was not restarted"
    );
    acquire(&mut client, "k2", "10 milliseconds");
    assert!(
        eventually(Duration::from_secs(5), || unswept(&mut client) == 0),
        "the restarted sweeper does not sweep"
    );
}

/// Before CREATE EXTENSION the worker waits; after it, it sweeps; grants keep working throughout.
#[test]
fn the_sweeper_waits_for_the_extension() {
    if skipped_on_the_sql_edition(WORKER) {
        return;
    }
    let cluster = Cluster::start_without_extension(
        "sweeper_late",
        26502,
        &["shared_preload_libraries=pg_fence", "pg_fence.sweep_interval=100ms"],
    );
    let mut client = cluster.connect();
    assert!(eventually(Duration::from_secs(10), || worker_pid(&mut client).is_some()), "no sweeper worker");
    thread::sleep(Duration::from_millis(500));
    assert!(worker_pid(&mut client).is_some(), "the worker died without the extension");
    client.batch_execute("CREATE EXTENSION pg_fence").unwrap();
    acquire(&mut client, "k", "10 milliseconds");
    assert!(
        eventually(Duration::from_secs(5), || unswept(&mut client) == 0),
        "nothing swept after CREATE EXTENSION"
    );
}

/// fence.sweep() called by hand, without the worker: it marks expired leases free and keeps their
/// fences; it is for fence_admin; and it never runs inside a transaction block, where the rows it
/// swept would stay locked, and their next acquirers waiting, for as long as the block stays open.
#[test]
fn a_sweep_by_hand_frees_expired_leases_and_is_for_fence_admin_in_its_own_transaction() {
    let cluster = Cluster::start("sweep_by_hand", 26503, &[]);
    let mut client = cluster.connect();
    client
        .batch_execute(
            "SELECT fence.lease_acquire('expired', '10 ms'); SELECT fence.lease_acquire('live', '1 minute');
             SELECT pg_sleep(0.03);",
        )
        .unwrap();
    assert_eq!(client.query_one("SELECT fence.sweep()", &[]).unwrap().get::<_, i64>(0), 1);
    assert_eq!(client.query_one("SELECT fence.sweep()", &[]).unwrap().get::<_, i64>(0), 0, "nothing left");
    let row = client
        .query_one(
            "SELECT (SELECT token_hash IS NULL FROM fence.lease_state WHERE key = 'expired'),
                    (SELECT live FROM fence.leases WHERE key = 'live'), total_swept, last_swept FROM fence.sweeper",
            &[],
        )
        .unwrap();
    assert!(row.get::<_, bool>(0) && row.get::<_, bool>(1));
    assert_eq!((row.get::<_, i64>(2), row.get::<_, i64>(3)), (1, 0));
    let swept_fence: i64 =
        client.query_one("SELECT fence FROM fence.lease_state WHERE key = 'expired'", &[]).unwrap().get(0);
    let next = acquire(&mut client, "expired", "1 minute").expect("the swept key is free").fence;
    assert!(next > swept_fence, "sweeping lowered the fence");

    let err = client.batch_execute("BEGIN; SELECT fence.sweep();").unwrap_err();
    assert_eq!(sqlstate(&err), "25001", "{err}");
    client.batch_execute("ROLLBACK; CREATE ROLE app LOGIN; GRANT fence_user TO app").unwrap();
    let mut app = cluster.connect_as("app");
    let err = app.query_one("SELECT fence.sweep()", &[]).unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "an ordinary role may sweep: {err}");
    let err = app.query_one("SELECT fence.lease_revoke('live')", &[]).unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "{err}");
    client.batch_execute("GRANT fence_admin TO app").unwrap();
    assert_eq!(app.query_one("SELECT fence.sweep()", &[]).unwrap().get::<_, i64>(0), 0);
}

/// A sweep that finds the sweeper's figures locked (another sweep, or anyone holding that row)
/// returns at once without sweeping. A sweep that swept first and then waited for the figures' row
/// would hold the rows it had swept, and the next acquirers of those keys would wait too.
#[test]
fn a_sweep_never_waits_while_holding_swept_leases() {
    let cluster = Cluster::start("sweep_no_wait", 26504, &[]);
    let mut client = cluster.connect();
    let old: i64 = client
        .query_one("SELECT fence FROM fence.lease_acquire('expired', '10 ms'), pg_sleep(0.03)", &[])
        .unwrap()
        .get(0);
    let mut figures = cluster.connect();
    figures.batch_execute("BEGIN; SELECT * FROM fence.sweeper_stats FOR UPDATE;").unwrap();

    let mut sweeper = cluster.connect();
    let sweep = thread::spawn(move || {
        sweeper.batch_execute("SET statement_timeout = '10s'").unwrap();
        sweeper
            .query_one("SELECT fence.sweep()", &[])
            .map(|row| row.get::<_, i64>(0))
            .map_err(|e| sqlstate(&e))
    });
    thread::sleep(Duration::from_millis(300));
    client.batch_execute("SET lock_timeout = '2s'").unwrap();
    let granted = Acquire::new("expired", "1 minute").try_run(&mut client);
    let granted = granted.map_err(|e| sqlstate(&e)).expect("the acquirer waited for the sweep");
    assert!(granted.expect("the expired key is free").fence > old);
    figures.batch_execute("COMMIT").unwrap();
    assert_eq!(sweep.join().unwrap(), Ok(0), "a sweep ran while another held the figures");
}

const SHARED_MEMORY_SWEEP: &str = "fast leases in shared memory, whose sweep takes the key's lock \
     (the edition's are rows of a table, whose row locks grants wait for)";

/// An acquire without a wait waits out a sweep that is ending its key's expired lease, or deleting
/// a row a dropped pg_fence left in shared memory (the milliseconds docs/reference.md allows),
/// rather than finding the key held: for a fast lease in shared memory the sweep holds the key's
/// lock, for a lease in a table the row's.
#[test]
fn an_acquire_without_wait_waits_out_a_sweep_of_its_key() {
    let (cluster, mut client) = with_held_sweeps("sweep_then_grant", 26508);
    for durable in [false, true] {
        for in_a_set in [false, true] {
            let key = format!(
                "{}-{}",
                if durable { "durable" } else { "fast" },
                if in_a_set { "set" } else { "alone" }
            );
            let old = Acquire::new(&key, "10 ms").durable(durable).run(&mut client).unwrap().fence;
            thread::sleep(Duration::from_millis(30));
            let fence = acquire_during_a_sweep(&cluster, &mut client, &key, durable, in_a_set);
            assert!(fence > old, "{key}: fence {fence} not above {old}");
        }
    }
    if edition() == Edition::Extension {
        let old = Acquire::new("dropped", "1 hour").durable(false).run(&mut client).unwrap().fence;
        client.batch_execute("DROP EXTENSION pg_fence; CREATE EXTENSION pg_fence").unwrap();
        let fence = acquire_during_a_sweep(&cluster, &mut client, "dropped", false, false);
        assert!(fence > old, "dropped: fence {fence} not above {old}");
    }
}

/// The fence of `key`'s grant (wait 0, alone or in a set), asked for while a sweep that ends or
/// deletes `key`'s row, the only one it can, is held in its last statement, and the sweep let go
/// once the grant waits for it.
fn acquire_during_a_sweep(
    cluster: &Cluster,
    client: &mut Client,
    key: &str,
    durable: bool,
    in_a_set: bool,
) -> i64 {
    let sweep = HeldSweep::start(cluster, client);
    let mut acquirer = cluster.connect();
    let key_ = key.to_string();
    let granted = thread::spawn(move || -> Option<i64> {
        if in_a_set {
            let rows = acquirer.query_opt(
                "SELECT fence FROM fence.lease_acquire_all(ARRAY[$1], '1 minute', durable => $2)",
                &[&key_, &durable],
            );
            rows.unwrap().map(|row| row.get(0))
        } else {
            Acquire::new(&key_, "1 minute").durable(durable).run(&mut acquirer).map(|lease| lease.fence)
        }
    });
    // Refused at once (the fault), or waiting for the sweep.
    let waited = eventually(Duration::from_secs(30), || {
        granted.is_finished() || waiting(client, "%fence.lease_acquire%") == 1
    });
    assert!(waited, "{key}: the acquire neither returned nor waited");
    assert!(sweep.end(client) >= 1, "{key}: the sweep ended or deleted no row");
    granted.join().unwrap().unwrap_or_else(|| panic!("{key}: refused while a sweep ended or deleted its row"))
}

/// A cluster whose worker does not sweep, with the function of `HeldSweep`'s trigger: it waits for
/// advisory lock 7 of the test's own session.
fn with_held_sweeps(name: &str, port: u16) -> (Cluster, Client) {
    let cluster =
        Cluster::start(name, port, &["shared_preload_libraries=pg_fence", "pg_fence.sweep_interval=1h"]);
    let mut client = cluster.connect();
    client
        .batch_execute(
            "CREATE FUNCTION public.held_figures() RETURNS trigger LANGUAGE plpgsql
               AS $$ BEGIN PERFORM pg_advisory_xact_lock(7); RETURN NEW; END $$;",
        )
        .unwrap();
    (cluster, client)
}

/// How many sessions wait for a lock in a query LIKE `query`.
fn waiting(client: &mut Client, query: &str) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1",
            &[&query],
        )
        .unwrap()
        .get(0)
}

/// A sweep (`fence.sweep()`, by another session) held in its last statement, after it has swept,
/// until `end`: a trigger on that statement waits for an advisory lock that `gate` holds.
struct HeldSweep {
    gate: Client,
    sweep: thread::JoinHandle<i64>,
}

impl HeldSweep {
    fn start(cluster: &Cluster, client: &mut Client) -> HeldSweep {
        client
            .batch_execute(
                "CREATE OR REPLACE TRIGGER held_figures BEFORE UPDATE ON fence.sweeper_stats
                    FOR EACH ROW EXECUTE FUNCTION public.held_figures()",
            )
            .unwrap();
        let mut gate = cluster.connect();
        gate.batch_execute("SELECT pg_advisory_lock(7)").unwrap();
        let mut sweeper = cluster.connect();
        let sweep =
            thread::spawn(move || sweeper.query_one("SELECT fence.sweep()", &[]).unwrap().get::<_, i64>(0));
        assert!(
            eventually(Duration::from_secs(30), || waiting(client, "%fence.sweep()%") == 1),
            "the sweep never reached its last statement"
        );
        HeldSweep { gate, sweep }
    }

    /// Lets the sweep end; what it returned.
    fn end(mut self, client: &mut Client) -> i64 {
        self.gate.batch_execute("SELECT pg_advisory_unlock(7)").unwrap();
        let swept = self.sweep.join().unwrap();
        client.batch_execute("DROP TRIGGER held_figures ON fence.sweeper_stats").unwrap();
        swept
    }
}

/// A set that waits out a sweep of one of its keys holds none of its keys meanwhile: an acquire of
/// another of them goes through (and the set, finding it held after the sweep, gets nothing).
#[test]
fn a_set_waiting_out_a_sweep_holds_none_of_its_keys() {
    if skipped_on_the_sql_edition(SHARED_MEMORY_SWEEP) {
        return;
    }
    let (cluster, mut client) = with_held_sweeps("sweep_set", 26509);
    Acquire::new("swept", "10 ms").durable(false).run(&mut client).unwrap();
    thread::sleep(Duration::from_millis(30));
    let sweep = HeldSweep::start(&cluster, &mut client);
    let mut set_client = cluster.connect();
    let set = thread::spawn(move || {
        set_client
            .query("SELECT key FROM fence.lease_acquire_all(ARRAY['free', 'swept'], '1 minute', durable => false)", &[])
            .unwrap()
            .len()
    });
    assert!(
        eventually(Duration::from_secs(30), || waiting(&mut client, "%lease_acquire_all%") == 1),
        "the set never waited for the sweep"
    );
    let free = Acquire::new("free", "1 minute").durable(false).run(&mut client);
    assert!(free.is_some(), "a key of a set waiting out a sweep of another of its keys was held");
    assert!(sweep.end(&mut client) >= 1, "the sweep ended no row");
    assert_eq!(set.join().unwrap(), 0, "the set was granted a key held by another");
}

/// An acquire with `wait` waits for a sweep of its key no longer than its `wait`: the sweep, held
/// open, outlasts it.
#[test]
fn a_waiting_acquire_waits_for_a_sweep_no_longer_than_its_wait() {
    if skipped_on_the_sql_edition(SHARED_MEMORY_SWEEP) {
        return;
    }
    let (cluster, mut client) = with_held_sweeps("sweep_deadline", 26510);
    Acquire::new("swept", "10 ms").durable(false).run(&mut client).unwrap();
    thread::sleep(Duration::from_millis(30));
    let sweep = HeldSweep::start(&cluster, &mut client);
    let mut acquirer = cluster.connect();
    let acquire = thread::spawn(move || {
        Acquire::new("swept", "1 minute").durable(false).wait("300 ms").run(&mut acquirer).is_some()
    });
    let returned = eventually(Duration::from_secs(30), || acquire.is_finished());
    sweep.end(&mut client);
    assert!(returned, "an acquire with a wait of 300 ms waited for the whole sweep");
    assert!(!acquire.join().unwrap(), "granted while the sweep held the key");
}

fn count(client: &mut Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).unwrap().get(0)
}

/// pg_fence.retain_ended: the sweep keeps an ended lease's row that long, then deletes it, and the
/// key's next grant is still above every fence it had (fence.high_water). It is a superuser's
/// setting, per database as well as per server.
#[test]
fn rows_of_long_ended_leases_are_deleted_and_their_keys_granted_above_them() {
    let cluster = Cluster::start("retain_ended", 26505, &[]);
    let mut client = cluster.connect();
    let released: i64 = count(
        &mut client,
        "SELECT l.fence FROM fence.lease_acquire('released', '1 hour') l
          WHERE fence.lease_release('released', l.token)",
    );
    let expired: i64 =
        count(&mut client, "SELECT fence FROM fence.lease_acquire('expired', '10 ms'), pg_sleep(0.03)");
    acquire(&mut client, "live", "1 hour");

    // Within the default hour: the expired lease is marked ended, no row goes.
    assert_eq!(count(&mut client, "SELECT fence.sweep()"), 1);
    assert_eq!(count(&mut client, "SELECT count(*) FROM fence.lease_state"), 3);

    set_fence_setting(&mut client, "retain_ended", "0");
    assert_eq!(count(&mut client, "SELECT fence.sweep()"), 2, "both ended rows go");
    let row = client
        .query_one(
            "SELECT array_agg(key ORDER BY key)::text, fence.current_fence('released') IS NULL,
                    (SELECT total_deleted FROM fence.sweeper), (SELECT fence FROM fence.high_water)
               FROM fence.leases",
            &[],
        )
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "{live}", "fence.leases lists only the live lease");
    assert!(row.get::<_, bool>(1), "current_fence of a deleted key is NULL");
    assert_eq!(row.get::<_, i64>(2), 2);
    assert_eq!(
        row.get::<_, i64>(3),
        released.max(expired),
        "the high-water mark is the highest deleted fence"
    );
    let again = count(&mut client, "SELECT fence FROM fence.lease_acquire('released', '1 hour')");
    assert!(
        again > released.max(expired),
        "a deleted key came back at {again}, not above the high-water mark"
    );

    if skipped_on_the_sql_edition(
        "the rest is of pg_fence.retain_ended as a GUC; the edition's is fence.settings' row, which fence_admin updates",
    ) {
        return;
    }
    client.batch_execute("CREATE ROLE admin LOGIN; GRANT fence_admin TO admin").unwrap();
    // Once pg_fence is loaded in the session; before, PostgreSQL takes any value as a placeholder
    // and drops a non-superuser's when the library loads.
    let mut admin = cluster.connect_as("admin");
    admin.query_one("SELECT fence.current_fence('live')", &[]).unwrap();
    let err = admin.batch_execute("SET pg_fence.retain_ended = 0").unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "a non-superuser set the retention: {err}");
    client.batch_execute("ALTER DATABASE postgres SET pg_fence.retain_ended = '90s'").unwrap();
    let shown: String = cluster.connect().query_one("SHOW pg_fence.retain_ended", &[]).unwrap().get(0);
    assert_eq!(shown, "90s", "the per-database setting did not reach a new session");
}

/// 100,000 distinct keys acquired and released: once their retention has passed, the sweeper
/// worker leaves only the live leases in the table, and every key granted again gets a fence above
/// its old one. (Fences counted per key would have to keep every key's row forever.)
#[test]
fn a_churn_of_keys_leaves_only_live_and_recent_leases() {
    if skipped_on_the_sql_edition(WORKER) {
        return;
    }
    const KEYS: i64 = 100_000;
    const LIVE: i64 = 10;
    let cluster = Cluster::start(
        "churn",
        26506,
        &[
            // Durability is not what this test is about: 200,000 flushed commits would take minutes.
            "fsync=off",
            "shared_preload_libraries=pg_fence",
            "pg_fence.sweep_interval=100ms",
            "pg_fence.retain_ended=1s",
        ],
    );
    let mut client = cluster.connect();
    // One transaction per key, as applications take them (one holding 100,000 key locks would run
    // out of lock table space); old fences kept aside to compare with the next grants. (A DO block
    // that commits must be a statement of its own, outside any transaction block.)
    client.batch_execute("CREATE TABLE old_fence (key text PRIMARY KEY, fence bigint NOT NULL)").unwrap();
    client
        .batch_execute(&format!(
            "DO $$
             DECLARE l fence.lease;
             BEGIN
                 FOR i IN 1..{KEYS} LOOP
                     l := fence.lease_acquire('invoice:' || i, '1 hour');
                     PERFORM fence.lease_release(l.key, l.token);
                     INSERT INTO old_fence VALUES (l.key, l.fence);
                     COMMIT;
                 END LOOP;
             END $$"
        ))
        .unwrap();
    for i in 0..LIVE {
        client.query_one("SELECT fence.lease_acquire('live:' || $1::bigint, '1 hour')", &[&i]).unwrap();
    }
    assert_eq!(count(&mut client, "SELECT count(*) FROM old_fence WHERE fence IS NOT NULL"), KEYS);

    let mut rows = 0;
    let tidied = eventually(Duration::from_secs(120), || {
        rows = count(&mut client, "SELECT count(*) FROM fence.lease_state");
        rows == LIVE
    });
    assert!(tidied, "{rows} rows left in fence.lease_state; only the {LIVE} live leases should be");
    assert!(count(&mut client, "SELECT total_deleted FROM fence.sweeper") >= KEYS);

    client.batch_execute("CREATE TABLE new_fence (key text PRIMARY KEY, fence bigint)").unwrap();
    client
        .batch_execute(
            "DO $$
             DECLARE k text;
             BEGIN
                 FOR k IN SELECT key FROM old_fence LOOP
                     INSERT INTO new_fence SELECT k, (fence.lease_acquire(k, '1 hour')).fence;
                     COMMIT;
                 END LOOP;
             END $$;",
        )
        .unwrap();
    let not_above = count(
        &mut client,
        "SELECT count(*) FROM old_fence o JOIN new_fence n USING (key) WHERE n.fence IS NULL OR n.fence <= o.fence",
    );
    println!("churn: {KEYS} keys, {rows} rows left after the sweeps, {not_above} regrants not above their old fence");
    assert_eq!(not_above, 0);
    assert_eq!(count(&mut client, "SELECT count(*) FROM new_fence"), KEYS);
}

/// The SQL edition's grants sweep their own key (issue 43: the sweep "done opportunistically by
/// grants"): a grant deletes the key's other rows whose leases ended more than retain_ended ago,
/// raising the high-water mark, but never the row of an ended lease whose writer is still open.
#[test]
fn a_grant_sweeps_its_own_key_on_the_sql_edition() {
    if edition() != Edition::Sql {
        return; // the extension's sweep is its worker's and fence.sweep()'s
    }
    let cluster = Cluster::start("grant_sweeps", 26507, &[]);
    let (mut client, mut writer) = (cluster.connect(), cluster.connect());
    set_fence_setting(&mut client, "retain_ended", "0");
    let rows = |client: &mut Client| count(client, "SELECT count(*) FROM fence.lease_state WHERE key = 'k'");
    let shared = |client: &mut Client| Acquire::new("k", "1 hour").shared(true).run(client).expect("shared");
    let (a, b, c) = (shared(&mut client), shared(&mut client), shared(&mut client));
    assert_eq!(rows(&mut client), 3);
    // c's writer stays open under it
    writer.batch_execute("BEGIN").unwrap();
    writer.query_one("SELECT fence.fence_guard('k', $1)", &[&c.fence]).unwrap();
    assert!(b.release(&mut client) && c.release(&mut client));
    let d = shared(&mut client); // slot 1 again
    assert_eq!(rows(&mut client), 3, "the grant deleted the row of a lease whose writer is open");
    writer.batch_execute("COMMIT").unwrap();
    let e = shared(&mut client); // slot 2 again: nothing to delete
    assert!(e.release(&mut client));
    let f = shared(&mut client); // slot 2: e's row reused
    assert!(d.release(&mut client) && f.release(&mut client));
    let high_water: Option<i64> =
        client.query_one("SELECT (SELECT fence FROM fence.high_water)", &[]).unwrap().get(0);
    assert_eq!(high_water, None, "nothing deleted yet");
    let g = Acquire::new("k", "1 hour").shared(true).run(&mut client).expect("shared"); // slot 1
    assert_eq!(rows(&mut client), 2, "the grant kept an ended row of its key");
    let high_water: i64 = client.query_one("SELECT fence FROM fence.high_water", &[]).unwrap().get(0);
    assert_eq!(high_water, f.fence, "the high-water mark is the deleted row's fence");
    assert!(a.release(&mut client) && g.release(&mut client));
}
