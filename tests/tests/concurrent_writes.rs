//! fenced_write and versioned_update against a writer that replaces the rows they are about to
//! write (DELETE, then INSERT of a row matching the same filter) and commits while they wait: the
//! rows they check must be the rows they write, so the replacement's higher fence or other version
//! is seen and refused, and nothing is written.
use pg_fence_integration::{backend_pid, comes_to_wait_on, sqlstate, Cluster};
use postgres::Client;
use std::thread;

/// Runs `call` in another session, waits until it waits for a row lock that `blocker` holds, lets
/// `blocker` commit, and returns the call's outcome: its value, or its SQLSTATE.
fn outcome_after_blocker_commits(
    cluster: &Cluster,
    blocker: &mut Client,
    call: &'static str,
) -> Result<i64, String> {
    let mut session = cluster.connect();
    let pid = backend_pid(&mut session);
    let call =
        thread::spawn(move || session.query_one(call, &[]).map(|row| row.get(0)).map_err(|e| sqlstate(&e)));
    let mut observer = cluster.connect();
    assert!(
        comes_to_wait_on(&mut observer, pid, "Lock"),
        "the write never waited for the replacing transaction"
    );
    blocker.batch_execute("COMMIT").unwrap();
    call.join().unwrap()
}

fn rows(client: &mut Client, table: &str) -> Vec<String> {
    client
        .query(&format!("SELECT t::text FROM {table} t ORDER BY 1"), &[])
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

#[test]
fn fenced_write_refuses_a_row_replaced_with_a_higher_fence_while_it_waited() {
    let cluster = Cluster::start("write_replaced", 26410, &[]);
    let mut client = cluster.connect();
    client
        .batch_execute(
            "CREATE TABLE res (id int PRIMARY KEY, grp int NOT NULL, val text, fence bigint);
             INSERT INTO res VALUES (42, 1, 'v', 5), (43, 2, 'w', 5), (44, 2, 'x', 5), (46, 4, 'y', 5);",
        )
        .unwrap();

    // One row: the writer under fence 100 replaces row 42 while fenced_write under fence 7 waits.
    let mut replacer = cluster.connect();
    replacer
        .batch_execute("BEGIN; DELETE FROM res WHERE id = 42; INSERT INTO res VALUES (42, 1, 'new', 100);")
        .unwrap();
    let outcome = outcome_after_blocker_commits(
        &cluster,
        &mut replacer,
        "SELECT fence.fenced_write('res', 'fence', 7, '{\"val\": \"STALE\"}', '{\"id\": 42}')",
    );
    assert_eq!(outcome, Err("PF002".into()), "a write under fence 7 over a row at fence 100");
    assert_eq!(rows(&mut client, "res")[0], "(42,1,new,100)");

    // Several rows: one of group 2 is replaced at fence 100 and another one joins the group; the
    // write must refuse them all, including the untouched row 44 it had already checked.
    replacer
        .batch_execute(
            "BEGIN; DELETE FROM res WHERE id = 43; INSERT INTO res VALUES (43, 2, 'new', 100), (45, 2, 'new', 100);",
        )
        .unwrap();
    let outcome = outcome_after_blocker_commits(
        &cluster,
        &mut replacer,
        "SELECT fence.fenced_write('res', 'fence', 7, '{\"val\": \"STALE\"}', '{\"grp\": 2}')",
    );
    assert_eq!(outcome, Err("PF002".into()));
    assert_eq!(
        rows(&mut client, "res"),
        ["(42,1,new,100)", "(43,2,new,100)", "(44,2,x,5)", "(45,2,new,100)", "(46,4,y,5)"],
        "a stale write landed"
    );

    // A replacement at a lower fence is simply written over.
    replacer
        .batch_execute("BEGIN; DELETE FROM res WHERE id = 46; INSERT INTO res VALUES (46, 4, 'new', 6);")
        .unwrap();
    let outcome = outcome_after_blocker_commits(
        &cluster,
        &mut replacer,
        "SELECT fence.fenced_write('res', 'fence', 7, '{\"val\": \"seven\"}', '{\"grp\": 4}')",
    );
    assert_eq!(outcome, Ok(1));
    assert_eq!(rows(&mut client, "res")[4], "(46,4,seven,7)");
}

#[test]
fn versioned_update_sees_a_row_replaced_while_it_waited() {
    let cluster = Cluster::start("versioned_replaced", 26411, &[]);
    let mut client = cluster.connect();
    client
        .batch_execute(
            "CREATE TABLE doc (id int PRIMARY KEY, body text, version bigint NOT NULL);
             INSERT INTO doc VALUES (1, 'draft', 3);",
        )
        .unwrap();
    let mut replacer = cluster.connect();
    replacer
        .batch_execute("BEGIN; DELETE FROM doc WHERE id = 1; INSERT INTO doc VALUES (1, 'theirs', 9);")
        .unwrap();
    let outcome = outcome_after_blocker_commits(
        &cluster,
        &mut replacer,
        "SELECT fence.versioned_update('doc', 'version', 3, '{\"body\": \"mine\"}', '{\"id\": 1}')",
    );
    // The row is there, at another version: a conflict to retry, not "no such row".
    assert_eq!(outcome, Err("40001".into()));
    assert_eq!(rows(&mut client, "doc"), ["(1,theirs,9)"]);

    // Replaced at the expected version, it is written, once.
    replacer
        .batch_execute("BEGIN; DELETE FROM doc WHERE id = 1; INSERT INTO doc VALUES (1, 'again', 9);")
        .unwrap();
    let outcome = outcome_after_blocker_commits(
        &cluster,
        &mut replacer,
        "SELECT fence.versioned_update('doc', 'version', 9, '{\"body\": \"mine\"}', '{\"id\": 1}')",
    );
    assert_eq!(outcome, Ok(10));
    assert_eq!(rows(&mut client, "doc"), ["(1,mine,10)"]);
}

/// A fenced_write that met a replaced row at a higher fence must refuse, even when a trigger on the
/// rows it did write runs a fenced write of its own that fails (caught in the trigger's EXCEPTION
/// block): the inner write must not lose the outer one's finding.
#[test]
fn fenced_write_keeps_its_finding_across_a_failing_fenced_write_in_a_trigger() {
    let cluster = Cluster::start("write_nested", 26414, &[]);
    let mut client = cluster.connect();
    client
        .batch_execute(
            "CREATE TABLE res (id int PRIMARY KEY, grp int NOT NULL, val text, fence bigint);
             INSERT INTO res VALUES (50, 9, 'a', 5), (51, 9, 'b', 5);
             CREATE TABLE other (id int PRIMARY KEY, code int UNIQUE, fence bigint);
             INSERT INTO other VALUES (1, 1, NULL), (2, 2, NULL);
             CREATE FUNCTION nested_write() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 BEGIN
                     PERFORM fence.fenced_write('other', 'fence', 1, '{\"code\": 2}', '{\"id\": 1}');
                 EXCEPTION WHEN unique_violation THEN NULL;
                 END;
                 RETURN NULL;
             END $$;
             CREATE TRIGGER nested_write AFTER UPDATE ON res FOR EACH ROW EXECUTE FUNCTION nested_write();",
        )
        .unwrap();
    let mut replacer = cluster.connect();
    replacer
        .batch_execute("BEGIN; DELETE FROM res WHERE id = 50; INSERT INTO res VALUES (50, 9, 'new', 100);")
        .unwrap();
    let outcome = outcome_after_blocker_commits(
        &cluster,
        &mut replacer,
        "SELECT fence.fenced_write('res', 'fence', 7, '{\"val\": \"STALE\"}', '{\"grp\": 9}')",
    );
    assert_eq!(outcome, Err("PF002".into()));
    assert_eq!(rows(&mut client, "res"), ["(50,9,new,100)", "(51,9,b,5)"], "a stale write landed");
}
