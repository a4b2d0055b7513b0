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
