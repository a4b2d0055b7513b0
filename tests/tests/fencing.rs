//! Fenced writes seen from real clients and real processes: a holder paused past its TTL cannot
//! write once another holder has taken over, increments are never lost, and a new grant waits for
//! the writes made under the old fence.
use pg_fence_integration::{acquire, edition, signal, sqlstate, Cluster, Edition};
use postgres::Client;
use rand::Rng;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// A table whose trigger appends each write's fence to `history`: row updates are serialized by the
/// row lock, so `history` is the commit order of the writes.
const RESOURCE: &str = "
    CREATE TABLE resource (id int PRIMARY KEY, value text, last_fence bigint, history bigint[] NOT NULL DEFAULT '{}');
    INSERT INTO resource (id, value) VALUES (1, 'initial');
    CREATE FUNCTION record_fence() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN NEW.history := OLD.history || NEW.last_fence; RETURN NEW; END $$;
    CREATE TRIGGER record_fence BEFORE UPDATE ON resource FOR EACH ROW EXECUTE FUNCTION record_fence();";

fn assert_history_in_fence_order(client: &mut Client) -> Vec<i64> {
    let history: Vec<i64> =
        client.query_one("SELECT history FROM resource WHERE id = 1", &[]).unwrap().get(0);
    for pair in history.windows(2) {
        assert!(
            pair[0] <= pair[1],
            "a write under fence {} committed after one under {}: {history:?}",
            pair[1],
            pair[0]
        );
    }
    history
}

/// Kleppmann's scenario, 100 times with random timing. A (a separate process) acquires and, after a
/// random delay, writes; it is SIGSTOPped at a random moment for longer than its TTL. B takes over
/// and writes in the transaction of its grant. Then A is resumed. A's write may land before B's
/// grant (it was in time) or be refused; it must never land after B's grant.
#[test]
fn a_paused_holder_never_writes_after_its_successor_was_granted() {
    let cluster = Cluster::start("kleppmann", 26401, &[]);
    let mut b = cluster.connect();
    b.batch_execute(RESOURCE).unwrap();
    let writer = env!("CARGO_BIN_EXE_paused_writer");
    let mut rng = rand::thread_rng();
    let (mut refused, mut in_time) = (0, 0);
    let mut last_fence = i64::MIN;
    for round in 0..100 {
        let ttl_ms = rng.gen_range(60..150u64);
        let delay_ms = rng.gen_range(0..ttl_ms);
        let mode = if rng.gen_bool(0.5) { "single" } else { "transaction" };
        let mut a = Command::new(writer)
            .args([
                &cluster.port().to_string(),
                "resource:1",
                &ttl_ms.to_string(),
                &delay_ms.to_string(),
                mode,
            ])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut a_out = BufReader::new(a.stdout.take().unwrap()).lines();
        let a_fence: i64 = a_out.next().unwrap().unwrap().strip_prefix("fence ").unwrap().parse().unwrap();
        assert!(a_fence > last_fence, "round {round}: A got fence {a_fence} after {last_fence}");
        let granted_at = Instant::now();
        thread::sleep(Duration::from_millis(rng.gen_range(0..ttl_ms)));
        signal(a.id(), "-STOP");
        // A's lease runs out while it is stopped.
        thread::sleep(Duration::from_millis(ttl_ms + 20).saturating_sub(granted_at.elapsed()));

        // B may have to wait for A's guard (when A was stopped inside its fenced transaction).
        let b_thread = {
            let mut b = cluster.connect();
            thread::spawn(move || {
                let mut tx = b.transaction().unwrap();
                let b_lease = loop {
                    if let Some(lease) = acquire(&mut tx, "resource:1", "1 minute") {
                        break lease;
                    }
                    thread::sleep(Duration::from_millis(2));
                };
                let b_fence = b_lease.fence;
                tx.query_one(
                    "SELECT fence.fenced_update('resource:1', $1, 'resource',
                            jsonb_build_object('value', 'B-' || $1::bigint, 'last_fence', $1::bigint), '{\"id\": 1}')",
                    &[&b_fence],
                )
                .unwrap();
                tx.commit().unwrap();
                b_lease
            })
        };
        thread::sleep(Duration::from_millis(30));
        signal(a.id(), "-CONT");
        let b_lease = b_thread.join().unwrap();
        let b_fence = b_lease.fence;
        assert!(b_fence > a_fence, "round {round}: B got fence {b_fence} after A's {a_fence}");
        last_fence = b_fence;
        let outcome = a_out.next().unwrap().unwrap();
        assert!(a.wait().unwrap().success());
        match outcome.as_str() {
            "accepted" => in_time += 1,
            "PF002" => refused += 1,
            other => panic!("round {round}: A's write failed with {other}"),
        }
        // B's write must be the last one: A's write, if accepted, came before B's grant.
        let value: String = b.query_one("SELECT value FROM resource WHERE id = 1", &[]).unwrap().get(0);
        assert_eq!(value, format!("B-{b_fence}"), "round {round}: a stale write landed after B's");
        let released = b_lease.release(&mut b);
        assert!(released);
    }
    let history = assert_history_in_fence_order(&mut b);
    assert_eq!(history.len(), 100 + in_time, "every accepted write is in the history");
    assert!(
        refused >= 10,
        "only {refused} of 100 stale writes were even attempted late; the test proves little"
    );
    eprintln!(
        "Kleppmann scenario: {refused} stale writes refused, {in_time} writes in time, 0 stale writes landed"
    );
}

/// One round of the counter workload: 8 clients each loop "acquire, read, sometimes pause past the
/// TTL, write read + 1, release". Returns (writes the clients believe landed, final counter).
fn counter_workload(cluster: &Cluster, fenced: bool) -> (i64, i64) {
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let mut client = cluster.connect();
            thread::spawn(move || {
                let mut rng = rand::thread_rng();
                let mut landed = 0;
                for _ in 0..40 {
                    let lease = loop {
                        if let Some(lease) = acquire(&mut client, "counter", "30 milliseconds") {
                            break lease;
                        }
                        thread::sleep(Duration::from_millis(1));
                    };
                    let fence = lease.fence;
                    let value: i64 = client.query_one("SELECT value FROM counter WHERE id = 1", &[]).unwrap().get(0);
                    if rng.gen_bool(0.15) {
                        thread::sleep(Duration::from_millis(45)); // past the TTL: another client takes over
                    }
                    let write = if fenced {
                        client.query_one(
                            "SELECT fence.fenced_update('counter', $1, 'counter', jsonb_build_object('value', $2::bigint), '{\"id\": 1}')",
                            &[&fence, &(value + 1)],
                        )
                        .map(|_| ())
                    } else {
                        client.execute("UPDATE counter SET value = $1 WHERE id = 1", &[&(value + 1)]).map(|_| ())
                    };
                    match write {
                        Ok(()) => landed += 1,
                        Err(err) => assert_eq!(sqlstate(&err), "PF002", "{err}"),
                    }
                    lease.release(&mut client);
                }
                landed
            })
        })
        .collect();
    let landed = workers.into_iter().map(|w| w.join().unwrap()).sum();
    let value = cluster.connect().query_one("SELECT value FROM counter WHERE id = 1", &[]).unwrap().get(0);
    (landed, value)
}

/// With fenced_update, every increment a client saw accepted is in the counter. The same workload
/// with a plain UPDATE loses increments, which shows the workload does provoke two holders at once.
#[test]
fn fenced_increments_are_never_lost_and_plain_ones_are() {
    let cluster = Cluster::start("counter", 26402, &[]);
    let mut client = cluster.connect();
    client.batch_execute("CREATE TABLE counter (id int PRIMARY KEY, value bigint NOT NULL)").unwrap();

    client.batch_execute("INSERT INTO counter VALUES (1, 0)").unwrap();
    let (accepted, value) = counter_workload(&cluster, true);
    assert_eq!(value, accepted, "fenced: {accepted} increments accepted, counter shows {value}");
    assert!(accepted < 320, "no write was refused: no client ever outlived its lease");

    client.batch_execute("UPDATE counter SET value = 0").unwrap();
    let (landed, value) = counter_workload(&cluster, false);
    assert!(
        value < landed,
        "plain: {landed} increments 'landed' and none was lost ({value}): the workload proves nothing"
    );
    eprintln!(
        "counter: fenced {accepted} accepted = {accepted} counted; plain {landed} landed, {value} counted"
    );
}

/// Invariant 3: a write accepted under fence F commits before any grant above F. A writer passes
/// fence_guard, keeps its transaction open past its lease's expiry; a new acquirer waits for it.
#[test]
fn a_new_grant_waits_for_the_writer_under_the_old_fence() {
    let cluster = Cluster::start("guard_wait", 26403, &[]);
    let mut writer = cluster.connect();
    writer.batch_execute(RESOURCE).unwrap();
    let fence = acquire(&mut writer, "resource:1", "300 milliseconds").expect("the key is free").fence;
    let mut tx = writer.transaction().unwrap();
    tx.query_one("SELECT fence.fence_guard('resource:1', $1)", &[&fence]).unwrap();

    let acquirer = {
        let mut client = cluster.connect();
        thread::spawn(move || loop {
            let row = client
                .query_one(
                    "SELECT (l).fence, (l).acquired_at::text, pg_backend_pid() FROM fence.lease_acquire('resource:1', '1 minute', wait => '1 minute') l",
                    &[],
                )
                .unwrap();
            if let Some(fence) = row.get::<_, Option<i64>>(0) {
                return (fence, row.get::<_, String>(1));
            }
            thread::sleep(Duration::from_millis(5));
        })
    };
    // Past the lease's expiry, the acquirer must be waiting on the key's lock, not granted.
    thread::sleep(Duration::from_millis(600));
    let mut observer = cluster.connect();
    let waiting: i64 = observer
        .query_one(
            "SELECT count(*) FROM pg_stat_activity
              WHERE wait_event_type = 'Lock' AND wait_event = 'advisory' AND query LIKE '%lease_acquire%'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(waiting, 1, "the acquirer is not waiting for the writer");
    assert!(!acquirer.is_finished(), "a grant went ahead while a write under the old fence was open");

    tx.execute(
        "UPDATE resource SET value = 'written under the old fence', last_fence = $1 WHERE id = 1",
        &[&fence],
    )
    .unwrap();
    let committed_before: String = tx.query_one("SELECT clock_timestamp()::text", &[]).unwrap().get(0);
    tx.commit().unwrap();
    let (new_fence, acquired_at) = acquirer.join().unwrap();
    assert!(new_fence > fence, "fence {new_fence} granted after {fence}");
    let later: bool = observer
        .query_one("SELECT $1::text::timestamptz > $2::text::timestamptz", &[&acquired_at, &committed_before])
        .unwrap()
        .get(0);
    assert!(later, "grant at {acquired_at}, before the old writer's commit at {committed_before}");
}

/// fenced_write with tokens from two sources racing for one row: the row takes writes only in
/// increasing fence order; the late ones are refused with PF002.
#[test]
fn fenced_write_takes_racing_tokens_only_in_increasing_order() {
    let cluster = Cluster::start("fenced_write", 26404, &[]);
    cluster.connect().batch_execute(RESOURCE).unwrap();
    let writers: Vec<_> = [1i64, 2]
        .into_iter()
        .map(|first| {
            let mut client = cluster.connect();
            thread::spawn(move || {
                let (mut accepted, mut refused) = (0, 0);
                for fence in (first..400).step_by(2) {
                    let write = client.query_one(
                        "SELECT fence.fenced_write('resource', 'last_fence', $1, jsonb_build_object('value', 'w' || $1::bigint), '{\"id\": 1}')",
                        &[&fence],
                    );
                    match write {
                        Ok(_) => accepted += 1,
                        Err(err) => {
                            assert_eq!(sqlstate(&err), "PF002", "{err}");
                            refused += 1;
                        }
                    }
                }
                (accepted, refused)
            })
        })
        .collect();
    let (accepted, refused) =
        writers.into_iter().map(|w| w.join().unwrap()).fold((0, 0), |(a, r), (a2, r2)| (a + a2, r + r2));
    let history = assert_history_in_fence_order(&mut cluster.connect());
    assert_eq!(history.len(), accepted, "every accepted write, and only those, is in the history");
    assert!(refused > 0, "the two sources never raced");
}

/// versioned_update from 8 clients incrementing one row through a retry loop: the final value is
/// the number of successful updates, and every conflict surfaced as 40001.
#[test]
fn versioned_increments_from_eight_clients_all_count() {
    let cluster = Cluster::start("versioned", 26405, &[]);
    cluster
        .connect()
        .batch_execute(
            "CREATE TABLE counter (id int PRIMARY KEY, value bigint NOT NULL, version bigint NOT NULL);
                        INSERT INTO counter VALUES (1, 0, 1);",
        )
        .unwrap();
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let mut client = cluster.connect();
            thread::spawn(move || {
                let mut conflicts = 0;
                for _ in 0..30 {
                    loop {
                        let row = client.query_one("SELECT value, version FROM counter WHERE id = 1", &[]).unwrap();
                        let (value, version): (i64, i64) = (row.get(0), row.get(1));
                        let update = client.query_one(
                            "SELECT fence.versioned_update('counter', 'version', $1, jsonb_build_object('value', $2::bigint), '{\"id\": 1}')",
                            &[&version, &(value + 1)],
                        );
                        match update {
                            Ok(row) => {
                                assert_eq!(row.get::<_, i64>(0), version + 1);
                                break;
                            }
                            Err(err) => {
                                assert_eq!(sqlstate(&err), "40001", "{err}");
                                conflicts += 1;
                            }
                        }
                    }
                }
                conflicts
            })
        })
        .collect();
    let conflicts: i32 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    let row = cluster.connect().query_one("SELECT value, version FROM counter WHERE id = 1", &[]).unwrap();
    assert_eq!(row.get::<_, i64>(0), 240);
    assert_eq!(row.get::<_, i64>(1), 241);
    assert!(conflicts > 0, "8 clients never conflicted: the test proves little");
}

/// Under REPEATABLE READ the guard judges by the latest committed grant, not by the transaction's
/// older snapshot; and neither a guard that passed nor one that failed holds up the holder's renew.
#[test]
fn the_guard_sees_the_latest_grant_under_repeatable_read() {
    let cluster = Cluster::start("guard_rr", 26406, &[]);
    let mut holder = cluster.connect();
    let mut reader = cluster.connect();
    let mut other = cluster.connect();
    holder.batch_execute("SET lock_timeout = '2s'").unwrap();
    let first = acquire(&mut holder, "k", "200 milliseconds").expect("the key is free").fence;

    let mut old_snapshot =
        reader.build_transaction().isolation_level(postgres::IsolationLevel::RepeatableRead).start().unwrap();
    old_snapshot.query_one("SELECT count(*) FROM fence.leases", &[]).unwrap();
    thread::sleep(Duration::from_millis(300));
    let lease = acquire(&mut holder, "k", "1 minute").expect("the first lease has expired");
    let second = lease.fence;
    assert!(second > first, "fence {second} granted after {first}");
    let err = old_snapshot.query_one("SELECT fence.fence_guard('k', $1)", &[&first]).unwrap_err();
    // The SQL edition cannot read past its snapshot: the key changed since, so it refuses with
    // 40001 (retry) rather than decide (tests/regress/sql-edition/README.md).
    let refused = if edition() == Edition::Sql { "40001" } else { "PF002" };
    assert_eq!(sqlstate(&err), refused, "a stale fence passed under an old snapshot: {err}");
    old_snapshot.rollback().unwrap();

    let mut passed =
        reader.build_transaction().isolation_level(postgres::IsolationLevel::RepeatableRead).start().unwrap();
    passed.query_one("SELECT fence.fence_guard('k', $1)", &[&second]).unwrap();
    let mut failed =
        other.build_transaction().isolation_level(postgres::IsolationLevel::RepeatableRead).start().unwrap();
    let holds: bool = failed.query_one("SELECT fence.fence_holds('k', 0)", &[]).unwrap().get(0);
    assert!(!holds);
    // Both transactions are still open.
    lease.renew(&mut holder, "1 minute").unwrap();
    let released = lease.release(&mut holder);
    assert!(released);
    passed.commit().unwrap();
    failed.commit().unwrap();
}

/// A fenced write names its table by OID; the backend that runs it keeps the table's name and
/// columns from one call to the next (src/writes/table_facts.rs). Another session's DDL must reach that
/// memory before the next write: a name it kept could by then name another table, or a column of
/// another type. Each step first writes once, so the writer's backend has the names in memory.
#[test]
fn fenced_writes_follow_their_table_through_other_sessions_ddl() {
    let cluster = Cluster::start("write_ddl", 26407, &[]);
    let mut writer = cluster.connect();
    let mut ddl = cluster.connect();
    ddl.batch_execute(
        "CREATE SCHEMA s;
         CREATE DOMAIN s.ints AS int[];
         CREATE TABLE s.t (id int PRIMARY KEY, v int, n s.ints);
         INSERT INTO s.t VALUES (1, 0, '{}');",
    )
    .unwrap();
    let fence = acquire(&mut writer, "k", "1 hour").expect("the key is free").fence;
    let table: u32 = writer.query_one("SELECT 's.t'::regclass::oid", &[]).unwrap().get(0);
    let mut write = |changes: &str| -> Result<i64, postgres::Error> {
        let row = writer.query_one(
            "SELECT fence.fenced_update('k', $1, $2::oid::regclass, $3::text::jsonb, '{\"id\": 1}')",
            &[&fence, &table, &changes],
        )?;
        Ok(row.get(0))
    };

    assert_eq!(write(r#"{"v": 1}"#).unwrap(), 1);
    let ddl_steps = [
        // The table is renamed and another takes its name.
        (
            "ALTER TABLE s.t RENAME TO t_old; CREATE TABLE s.t (id int PRIMARY KEY, v int); INSERT INTO s.t VALUES (1, 0)",
            r#"{"v": 2}"#,
            "SELECT format('%s %s', (SELECT v FROM s.t_old), (SELECT v FROM s.t))",
            "2 0",
        ),
        // Its schema is renamed; then another schema takes that name, with a table of the same name.
        (
            "ALTER SCHEMA s RENAME TO s_old",
            r#"{"v": 3}"#,
            "SELECT v::text FROM s_old.t_old",
            "3",
        ),
        (
            "CREATE SCHEMA s; CREATE TABLE s.t_old (id int PRIMARY KEY, v int); INSERT INTO s.t_old VALUES (1, 0)",
            r#"{"v": 3}"#,
            "SELECT format('%s %s', (SELECT v FROM s_old.t_old), (SELECT v FROM s.t_old))",
            "3 0",
        ),
        // The column is renamed and a column of another type takes its name.
        (
            "ALTER TABLE s_old.t_old RENAME COLUMN v TO v_old; ALTER TABLE s_old.t_old ADD COLUMN v text",
            r#"{"v": "three"}"#,
            "SELECT format('%s %s', v_old, v) FROM s_old.t_old",
            "3 three",
        ),
        // The column's type changes.
        (
            "ALTER TABLE s_old.t_old ALTER COLUMN v TYPE bigint USING NULL",
            r#"{"v": 4, "n": [4]}"#,
            "SELECT format('%s %s', v_old, pg_typeof(v)) FROM s_old.t_old",
            "3 bigint",
        ),
        // The column's type (a domain, converted by jsonb_to_record) is renamed; then another type
        // takes its name.
        (
            "ALTER DOMAIN s_old.ints RENAME TO ints_old",
            r#"{"n": [5, 6]}"#,
            "SELECT format('%s %s', n, pg_typeof(n)) FROM s_old.t_old",
            "{5,6} s_old.ints_old",
        ),
        (
            "CREATE DOMAIN s_old.ints AS text[]",
            r#"{"n": [7]}"#,
            "SELECT format('%s %s', n, pg_typeof(n)) FROM s_old.t_old",
            "{7} s_old.ints_old",
        ),
    ];
    let mut previous = r#"{"v": 1}"#;
    for (change, changes, check, expected) in ddl_steps {
        write(previous).unwrap();
        ddl.batch_execute(change).unwrap();
        let written =
            write(changes).unwrap_or_else(|e| panic!("after {change:?}: {changes}: {:?}", e.as_db_error()));
        assert_eq!(written, 1, "after {change:?}");
        let found: String = ddl.query_one(check, &[]).unwrap().get(0);
        assert_eq!(found, expected, "after {change:?}: {changes} went to the wrong place");
        previous = changes;
    }
}

/// The filter compares by the equality operator of the column type's default operator class, which
/// the writer's backend keeps between calls too: another session's new default operator class, and
/// a move of its operator to another schema, must reach it before the next write.
#[test]
fn a_filter_follows_its_equality_operator_through_other_sessions_ddl() {
    let cluster = Cluster::start("write_ddl_ops", 26408, &[]);
    let mut writer = cluster.connect();
    let mut ddl = cluster.connect();
    // point has no default btree or hash operator class, so no equality operator a filter could use.
    ddl.batch_execute(
        "CREATE SCHEMA ops; CREATE SCHEMA ops_moved;
         CREATE FUNCTION ops.same(point, point) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT $1 ~= $2';
         CREATE FUNCTION ops.hash(point) RETURNS integer LANGUAGE sql IMMUTABLE
             AS 'SELECT hashfloat8($1[0]) # hashfloat8($1[1])';
         CREATE OPERATOR ops.=== (LEFTARG = point, RIGHTARG = point, FUNCTION = ops.same);
         CREATE TABLE places (id int PRIMARY KEY, at point, name text);
         INSERT INTO places VALUES (1, '(1,2)', 'before');",
    )
    .unwrap();
    let fence = acquire(&mut writer, "k", "1 hour").expect("the key is free").fence;
    let mut write = |name: &str| {
        writer.query_one(
            "SELECT fence.fenced_update('k', $1, 'places', jsonb_build_object('name', $2::text), '{\"at\": \"(1,2)\"}')",
            &[&fence, &name],
        )
    };
    let err = write("no operator").unwrap_err();
    assert_eq!(sqlstate(&err), "42883", "a filter on point without an equality operator: {err}");

    ddl.batch_execute(
        "CREATE OPERATOR CLASS ops.point_ops DEFAULT FOR TYPE point USING hash AS
             OPERATOR 1 ops.=== (point, point), FUNCTION 1 ops.hash(point)",
    )
    .unwrap();
    let written: i64 = write("by ops.===").unwrap_or_else(|e| panic!("{:?}", e.as_db_error())).get(0);
    assert_eq!(written, 1, "the new default operator class was not seen");

    ddl.batch_execute("ALTER OPERATOR ops.=== (point, point) SET SCHEMA ops_moved").unwrap();
    let written: i64 = write("by ops_moved.===").unwrap_or_else(|e| panic!("{:?}", e.as_db_error())).get(0);
    assert_eq!(written, 1, "the operator's move was not seen");
    let name: String = ddl.query_one("SELECT name FROM places WHERE id = 1", &[]).unwrap().get(0);
    assert_eq!(name, "by ops_moved.===");
}
