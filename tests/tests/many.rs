//! Calls for clients that keep many leases: lease_renew_many (many leases renewed in one call, each
//! with its own answer) and lease_acquire_any (the first free key of a list, as SKIP LOCKED takes
//! the first free row).
use pg_fence_integration::{acquire, sqlstate, Acquire, Cluster};
use postgres::Client;
use uuid::Uuid;

/// lease_renew_many over (key, token, ttl): each row's key, token and new expiry (seconds since
/// 1970), in the order of the rows returned.
fn renew_many(
    client: &mut Client,
    leases: &[(&str, Uuid, &str)],
) -> Result<Vec<(String, Uuid, Option<f64>)>, postgres::Error> {
    let keys: Vec<&str> = leases.iter().map(|(key, _, _)| *key).collect();
    let tokens: Vec<Uuid> = leases.iter().map(|(_, token, _)| *token).collect();
    let ttls: Vec<&str> = leases.iter().map(|(_, _, ttl)| *ttl).collect();
    let rows = client.query(
        "SELECT key, token, extract(epoch FROM expires_at)::float8
           FROM fence.lease_renew_many($1, $2, $3::text[]::interval[])",
        &[&keys, &tokens, &ttls],
    )?;
    Ok(rows.iter().map(|row| (row.get(0), row.get(1), row.get(2))).collect())
}

fn expires_at(client: &mut Client, key: &str) -> Option<f64> {
    client
        .query_opt(
            "SELECT extract(epoch FROM expires_at)::float8 FROM fence.leases WHERE key = $1 AND live",
            &[&key],
        )
        .unwrap()
        .and_then(|row| row.get(0))
}

#[test]
fn renew_many_renews_each_lease_for_its_own_ttl_and_answers_for_each() {
    let cluster = Cluster::start("renew_many", 27690, &[]);
    let (mut client, mut admin) = (cluster.connect(), cluster.connect());
    let durable = acquire(&mut client, "durable", "1 minute").unwrap();
    let fast = Acquire::new("fast", "1 minute").durable(false).run(&mut client).unwrap();
    let revoked = acquire(&mut client, "revoked", "1 minute").unwrap();
    assert!(admin.query_one("SELECT fence.lease_revoke('revoked')", &[]).unwrap().get::<_, bool>(0));
    let stranger = Uuid::from_u128(0x5742_a4e6_0000_4000_8000_0000_0000_0001);

    let now: f64 =
        client.query_one("SELECT extract(epoch FROM clock_timestamp())::float8", &[]).unwrap().get(0);
    let answers = renew_many(
        &mut client,
        &[
            ("revoked", revoked.token, "1 hour"),
            ("fast", fast.token, "2 hours"),
            ("durable", stranger, "1 hour"),
            ("durable", durable.token, "3 hours"),
        ],
    )
    .unwrap();
    let keys: Vec<&str> = answers.iter().map(|(key, _, _)| key.as_str()).collect();
    assert_eq!(keys, ["revoked", "fast", "durable", "durable"], "a row per lease, in the order given");
    assert_eq!(answers[2].1, stranger, "each row carries its lease's token");
    assert_eq!(
        (answers[0].2, answers[2].2),
        (None, None),
        "a lost lease or a stranger's token renewed something"
    );
    let (fast_until, durable_until) = (answers[1].2.unwrap(), answers[3].2.unwrap());
    assert!(
        (fast_until - now - 7_200.0).abs() < 60.0,
        "the fast lease got {} s, not its own 2 hours",
        fast_until - now
    );
    assert!(
        (durable_until - now - 10_800.0).abs() < 60.0,
        "the durable lease got {} s, not 3 hours",
        durable_until - now
    );
    assert_eq!(expires_at(&mut admin, "fast"), Some(fast_until));
    assert_eq!(
        expires_at(&mut admin, "durable"),
        Some(durable_until),
        "the stranger's token touched the lease"
    );
    assert_eq!(expires_at(&mut admin, "revoked"), None, "a revoked lease came back");

    // Rolled back, none of the renewals stays.
    let mut tx = client.transaction().unwrap();
    tx.query(
        "SELECT * FROM fence.lease_renew_many(ARRAY['durable'], ARRAY[$1::uuid], ARRAY['9 hours'::interval])",
        &[&durable.token],
    )
    .unwrap();
    tx.rollback().unwrap();
    assert_eq!(expires_at(&mut admin, "durable"), Some(durable_until), "a rolled-back renewal stayed");
    assert!(renew_many(&mut client, &[]).unwrap().is_empty(), "no leases, no rows");
}

#[test]
fn renew_many_refuses_bad_input_and_changes_nothing() {
    let cluster = Cluster::start("renew_many_input", 27691, &[]);
    let mut client = cluster.connect();
    let lease = acquire(&mut client, "k", "1 minute").unwrap();
    let before = expires_at(&mut client, "k");
    let call = |client: &mut Client, sql: &str| {
        let err = client.query(sql, &[&lease.token]).unwrap_err();
        (sqlstate(&err), err.as_db_error().map(|e| e.message().to_string()).unwrap_or_default())
    };
    let cases = [
        ("SELECT * FROM fence.lease_renew_many(ARRAY['k', 'k'], ARRAY[$1::uuid], ARRAY['1 h'::interval])", "22023", "one length"),
        ("SELECT * FROM fence.lease_renew_many(NULL, ARRAY[$1::uuid], ARRAY['1 h'::interval])", "22004", "keys"),
        ("SELECT * FROM fence.lease_renew_many(ARRAY['k'], ARRAY[$1::uuid], NULL)", "22004", "ttls"),
        ("SELECT * FROM fence.lease_renew_many(ARRAY[NULL, 'k'], ARRAY[NULL, $1::uuid], ARRAY['1 h', '1 h']::interval[])", "22004", "keys"),
        ("SELECT * FROM fence.lease_renew_many(ARRAY['k', 'j'], ARRAY[$1::uuid, NULL], ARRAY['1 h', '1 h']::interval[])", "22004", "tokens"),
        ("SELECT * FROM fence.lease_renew_many(ARRAY['k'], ARRAY[$1::uuid], ARRAY['-1 s'::interval])", "22023", "positive"),
        ("SELECT * FROM fence.lease_renew_many(ARRAY[''], ARRAY[$1::uuid], ARRAY['1 s'::interval])", "22023", "empty"),
        (
            "SELECT * FROM fence.lease_renew_many(array_fill('k'::text, ARRAY[65]), array_fill($1::uuid, ARRAY[65]),
                                                  array_fill('1 h'::interval, ARRAY[65]))",
            "22023",
            "limit of 64",
        ),
    ];
    for (sql, code, said) in cases {
        let (got, message) = call(&mut client, sql);
        assert_eq!(got, code, "{sql}: {message}");
        assert!(message.contains(said), "{sql}: the message does not say \"{said}\": {message}");
    }
    assert_eq!(expires_at(&mut client, "k"), before, "a refused call renewed the lease");
}

#[test]
fn acquire_any_grants_the_first_free_key_in_the_order_given() {
    let cluster = Cluster::start("acquire_any", 27692, &[]);
    let (mut client, mut other) = (cluster.connect(), cluster.connect());
    let any = |client: &mut Client, keys: &[&str], token: Option<Uuid>| -> Option<(String, i64, Uuid)> {
        let row = client
            .query_one("SELECT (l).key, (l).fence, (l).token FROM fence.lease_acquire_any($1, '1 hour', token => $2) l", &[&keys, &token])
            .unwrap();
        row.get::<_, Option<String>>(0).map(|key| (key, row.get(1), row.get(2)))
    };
    let held = acquire(&mut other, "item-1", "1 hour").unwrap();
    // item-2's lock is taken by another transaction that has not ended: passed over, not waited for.
    let mut changing = other.transaction().unwrap();
    let being_granted = acquire(&mut changing, "item-2", "1 hour").unwrap();
    let (key, fence, _) =
        any(&mut client, &["item-1", "item-2", "item-3", "item-4"], None).expect("item-3 is free");
    assert_eq!(key, "item-3", "not the first free key");
    changing.rollback().unwrap();
    drop(being_granted);

    // A retry with the token of a grant whose reply was lost gets that grant, whatever is free now.
    let mine = Uuid::from_u128(0x3141_5926_5358_4979_8323_8462_6433_8327);
    let first = any(&mut client, &["item-3", "item-2", "item-4"], Some(mine)).expect("item-2 is free");
    assert_eq!(first.0, "item-2");
    let again = any(&mut client, &["item-4", "item-2"], Some(mine)).expect("the retry got nothing");
    assert_eq!(again, first, "a retry was granted another key");

    assert!(any(&mut client, &["item-1", "item-2", "item-3"], None).is_none(), "a held key was granted");
    let current: i64 = client.query_one("SELECT fence.current_fence('item-3')", &[]).unwrap().get(0);
    assert_eq!(current, fence, "a refused call changed item-3");
    assert!(held.release(&mut other));
    let next = any(&mut client, &["item-3", "item-1"], None).expect("item-1 was released");
    assert!(next.0 == "item-1" && next.1 > held.fence, "item-1 granted below its old fence: {next:?}");
}

#[test]
fn acquire_any_refuses_bad_input_and_changes_nothing() {
    let cluster = Cluster::start("acquire_any_input", 27693, &[]);
    let mut client = cluster.connect();
    let cases = [
        ("SELECT fence.lease_acquire_any(ARRAY[]::text[], '1 h')", "22023", "must not be empty"),
        ("SELECT fence.lease_acquire_any(NULL, '1 h')", "22004", "keys"),
        ("SELECT fence.lease_acquire_any(ARRAY['a', NULL], '1 h')", "22004", "keys"),
        ("SELECT fence.lease_acquire_any(ARRAY['a', 'b', 'a'], '1 h')", "22023", "more than once"),
        ("SELECT fence.lease_acquire_any(ARRAY['a', ''], '1 h')", "22023", "empty"),
        ("SELECT fence.lease_acquire_any(ARRAY['a'], '0 s')", "22023", "positive"),
        ("SELECT fence.lease_acquire_any(ARRAY['a'], NULL)", "22004", "ttl"),
        ("SELECT fence.lease_acquire_any(ARRAY['a'], '1 h', token => '00000000-0000-0000-0000-000000000000')", "22023", "nil"),
        ("SELECT fence.lease_acquire_any(ARRAY(SELECT 'k' || i FROM generate_series(1, 1001) i), '1 h')", "22023", "limit of 1000"),
        ("SELECT fence.lease_acquire_any(ARRAY['a'], '1 h', durable => NULL)", "22004", "durable"),
    ];
    for (sql, code, said) in cases {
        let err = client.query(sql, &[]).unwrap_err();
        let message = err.as_db_error().map(|e| e.message().to_string()).unwrap_or_default();
        assert_eq!(sqlstate(&err), code, "{sql}: {message}");
        assert!(message.contains(said), "{sql}: the message does not say \"{said}\": {message}");
    }
    let granted: i64 = client.query_one("SELECT count(*) FROM fence.leases", &[]).unwrap().get(0);
    assert_eq!(granted, 0, "a refused call granted something");
    // A key list at the limit is taken whole.
    let row = client
        .query_one("SELECT (fence.lease_acquire_any(ARRAY(SELECT 'k' || i FROM generate_series(1, 1000) i), '1 h')).key", &[])
        .unwrap();
    assert_eq!(row.get::<_, Option<String>>(0).as_deref(), Some("k1"));
}
