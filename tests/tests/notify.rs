//! NOTIFY events on channel pg_fence, seen by a LISTENing client: one per lease change, delivered
//! only when the change commits.
use pg_fence_integration::Cluster;
use postgres::fallible_iterator::FallibleIterator;
use postgres::Client;
use std::time::Duration;

/// The payloads of the notifications that arrive within a short wait.
fn received(listener: &mut Client) -> Vec<String> {
    let mut notifications = listener.notifications();
    let mut pending = notifications.timeout_iter(Duration::from_millis(300));
    let mut payloads = Vec::new();
    while let Some(n) = pending.next().unwrap() {
        assert_eq!(n.channel(), "pg_fence");
        payloads.push(n.payload().to_string());
    }
    payloads
}

fn event(payload: &str, event: &str, key: &str, fence: i64) -> bool {
    payload.contains(&format!("\"event\":\"{event}\""))
        && payload.contains(&format!("\"key\":\"{key}\""))
        && payload.contains(&format!("\"fence\":{fence}"))
}

#[test]
fn every_lease_change_is_announced_at_commit() {
    let cluster = Cluster::start("notify", 26601, &[]);
    let mut listener = cluster.connect();
    listener.batch_execute("LISTEN pg_fence").unwrap();
    let mut client = cluster.connect();
    client.query_one("SELECT fence.lease_acquire('quiet', '1 minute')", &[]).unwrap();
    assert!(received(&mut listener).is_empty(), "announced with pg_fence.notify off (the default)");
    client.batch_execute("SET pg_fence.notify = on").unwrap();

    let mut tx = client.transaction().unwrap();
    let token: uuid::Uuid =
        tx.query_one("SELECT (fence.lease_acquire('k', '1 minute')).token", &[]).unwrap().get(0);
    assert!(received(&mut listener).is_empty(), "announced before commit");
    tx.commit().unwrap();
    let events = received(&mut listener);
    assert!(events.len() == 1 && event(&events[0], "acquired", "k", 1), "{events:?}");

    client.query_one("SELECT fence.lease_release('k', $1)", &[&token]).unwrap();
    let events = received(&mut listener);
    assert!(events.len() == 1 && event(&events[0], "released", "k", 1), "{events:?}");

    let mut tx = client.transaction().unwrap();
    tx.query_one("SELECT fence.lease_acquire('rolled-back', '1 minute')", &[]).unwrap();
    tx.rollback().unwrap();
    assert!(received(&mut listener).is_empty(), "a rolled-back grant was announced");

    client.query_one("SELECT fence.lease_acquire('k', '1 minute')", &[]).unwrap();
    client.query_one("SELECT fence.lease_revoke('k')", &[]).unwrap();
    let events = received(&mut listener);
    assert!(
        events.len() == 2 && event(&events[0], "acquired", "k", 2) && event(&events[1], "revoked", "k", 2),
        "{events:?}"
    );

    client.query_one("SELECT fence.lease_acquire('short', '10 milliseconds')", &[]).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    client.query_one("SELECT fence.sweep()", &[]).unwrap();
    let events = received(&mut listener);
    assert!(events.len() == 2 && event(&events[1], "expired", "short", 1), "{events:?}");
}

/// Any role may NOTIFY on any channel, so an event on pg_fence can be forged and is not told apart
/// from a real one: README says to treat events as hints and to confirm them in fence.leases. This
/// shows both halves of that: the forgery arrives as a real event would, and fence.leases does not
/// follow it.
#[test]
fn a_forged_event_looks_real_and_fence_leases_tells_the_truth() {
    let cluster = Cluster::start("notify_forged", 26602, &[]);
    let mut admin = cluster.connect();
    admin.batch_execute("CREATE ROLE forger LOGIN; SET pg_fence.notify = on").unwrap();
    let mut listener = cluster.connect();
    listener.batch_execute("LISTEN pg_fence").unwrap();
    admin.query_one("SELECT fence.lease_acquire('job', '1 minute')", &[]).unwrap();
    let real = received(&mut listener);
    assert!(real.len() == 1 && event(&real[0], "acquired", "job", 1), "{real:?}");

    let mut forger = cluster.connect_as("forger");
    forger.batch_execute(r#"NOTIFY pg_fence, '{"event":"revoked","fence":1,"key":"job"}'"#).unwrap();
    let forged = received(&mut listener);
    assert!(forged.len() == 1 && event(&forged[0], "revoked", "job", 1), "{forged:?}");

    let live: bool =
        listener.query_one("SELECT live FROM fence.leases WHERE key = 'job'", &[]).unwrap().get(0);
    assert!(live, "the lease the forged event called revoked is live");
}
