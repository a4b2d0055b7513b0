//! Invariant 3 under subtransactions: a guard taken inside a subtransaction that rolls back (ROLLBACK
//! TO SAVEPOINT, or a PL/pgSQL EXCEPTION block that caught an error) still holds back the key's next
//! grant until the top-level transaction ends, because the writes made after it are made under it.
use pg_fence_integration::{
    acquire, skipped_on_the_sql_edition, wait_until_past, Acquire, Cluster, Lease, GUARD_IN_SUBTRANSACTION,
};

const SETUP: &str = "
    CREATE TABLE resource (id int PRIMARY KEY, value text, last_fence bigint);
    -- The usual upsert fallback: guard and INSERT, and on a duplicate an UPDATE, in the handler,
    -- after the block's subtransaction (and the guard's, were it the block's) has rolled back.
    CREATE FUNCTION guarded_upsert(k text, f bigint, v text) RETURNS void LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM fence.fence_guard(k, f);
        INSERT INTO resource VALUES (1, v, f);
    EXCEPTION WHEN unique_violation THEN
        UPDATE resource SET value = v, last_fence = f WHERE id = 1;
    END $$;
    INSERT INTO resource VALUES (1, 'initial', 0);";

/// After the lease under which `writer` wrote has expired, and while `writer`'s transaction is still
/// open, another session's grant must wait for it: an acquire waiting half a second gets nothing.
/// Then the writer commits, and the grant goes through with a higher fence.
fn assert_grant_waits_for(cluster: &Cluster, mut writer: postgres::Transaction, lease: &Lease) {
    let (key, fence) = (lease.key.as_str(), lease.fence);
    let locks: i64 = writer
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory' AND objsubid = 28774",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(locks, 1, "the guard's key lock went with its subtransaction");
    wait_until_past(&mut writer, lease.expires_at);
    let mut acquirer = cluster.connect();
    let grant = Acquire::new(key, "1 minute").wait("500 milliseconds");
    let granted = grant.run(&mut acquirer).map(|lease| lease.fence);
    assert_eq!(granted, None, "a grant went ahead while a write under fence {fence} was still to commit");
    writer.commit().unwrap();
    let next = grant.run(&mut acquirer).expect("not granted after the writer committed").fence;
    assert!(next > fence, "fence {next} granted after {fence}");
}

#[test]
fn a_guard_rolled_back_to_a_savepoint_still_holds_back_the_next_grant() {
    if skipped_on_the_sql_edition(GUARD_IN_SUBTRANSACTION) {
        return;
    }
    let cluster = Cluster::start("guard_savepoint", 26412, &[]);
    let mut client = cluster.connect();
    client.batch_execute(SETUP).unwrap();
    let lease = acquire(&mut client, "sub:savepoint", "300 milliseconds").expect("the key is free");
    let fence = lease.fence;
    let mut writer = client.transaction().unwrap();
    writer.batch_execute("SAVEPOINT s").unwrap();
    writer.query_one("SELECT fence.fence_guard('sub:savepoint', $1)", &[&fence]).unwrap();
    writer.batch_execute("ROLLBACK TO SAVEPOINT s").unwrap();
    writer.execute("UPDATE resource SET value = 'after the savepoint', last_fence = $1", &[&fence]).unwrap();
    assert_grant_waits_for(&cluster, writer, &lease);
}

#[test]
fn a_guard_in_an_exception_block_still_holds_back_the_next_grant() {
    if skipped_on_the_sql_edition(GUARD_IN_SUBTRANSACTION) {
        return;
    }
    let cluster = Cluster::start("guard_exception", 26413, &[]);
    let mut client = cluster.connect();
    client.batch_execute(SETUP).unwrap();
    let lease = acquire(&mut client, "sub:upsert", "300 milliseconds").expect("the key is free");
    let fence = lease.fence;
    let mut writer = client.transaction().unwrap();
    writer.execute("SELECT guarded_upsert('sub:upsert', $1, 'upserted')", &[&fence]).unwrap();
    let value: String = writer.query_one("SELECT value FROM resource WHERE id = 1", &[]).unwrap().get(0);
    assert_eq!(value, "upserted", "the handler's UPDATE ran");
    assert_grant_waits_for(&cluster, writer, &lease);
}
