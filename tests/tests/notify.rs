//! NOTIFY events on channel pg_fence, seen by a LISTENing client: one per lease change, delivered
//! only when the change commits.
use pg_fence_integration::{acquire, edition, set_fence_setting, Cluster, Edition};
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
    // The whole number: a fence that only begins with `fence` is another one.
    let fence = format!("\"fence\":{fence}");
    let whole_fence = payload
        .match_indices(&fence)
        .any(|(at, _)| !payload[at + fence.len()..].starts_with(|c: char| c.is_ascii_digit()));
    payload.contains(&format!("\"event\":\"{event}\""))
        && payload.contains(&format!("\"key\":\"{key}\""))
        && whole_fence
}

#[test]
fn every_lease_change_is_announced_at_commit() {
    let cluster = Cluster::start("notify", 26601, &[]);
    let mut listener = cluster.connect();
    listener.batch_execute("LISTEN pg_fence").unwrap();
    let mut client = cluster.connect();
    acquire(&mut client, "quiet", "1 minute");
    assert!(received(&mut listener).is_empty(), "announced with pg_fence.notify off (the default)");
    client.batch_execute("SET pg_fence.notify = on").unwrap();
    set_fence_setting(&mut client, "notify_keys", "on");

    let mut tx = client.transaction().unwrap();
    let lease = acquire(&mut tx, "k", "1 minute").expect("the key is free");
    let fence = lease.fence;
    assert!(received(&mut listener).is_empty(), "announced before commit");
    tx.commit().unwrap();
    let events = received(&mut listener);
    assert!(events.len() == 1 && event(&events[0], "acquired", "k", fence), "{events:?}");

    lease.release(&mut client);
    let events = received(&mut listener);
    assert!(events.len() == 1 && event(&events[0], "released", "k", fence), "{events:?}");

    let mut tx = client.transaction().unwrap();
    acquire(&mut tx, "rolled-back", "1 minute");
    tx.rollback().unwrap();
    assert!(received(&mut listener).is_empty(), "a rolled-back grant was announced");

    let next = acquire(&mut client, "k", "1 minute").expect("the key was released").fence;
    assert!(next > fence, "fence {next} granted after {fence}");
    client.query_one("SELECT fence.lease_revoke('k')", &[]).unwrap();
    let events = received(&mut listener);
    assert!(
        events.len() == 2
            && event(&events[0], "acquired", "k", next)
            && event(&events[1], "revoked", "k", next),
        "{events:?}"
    );

    let short = acquire(&mut client, "short", "10 milliseconds").expect("the key is free").fence;
    std::thread::sleep(Duration::from_millis(50));
    client.query_one("SELECT fence.sweep()", &[]).unwrap();
    let events = received(&mut listener);
    assert!(events.len() == 2 && event(&events[1], "expired", "short", short), "{events:?}");
}

/// Any role may NOTIFY on any channel, so an event on pg_fence can be forged and is not told apart
/// from a real one: docs/reference.md (Notifications) says to treat events as hints and to confirm them in fence.leases. This
/// shows both halves of that: the forgery arrives as a real event would, and fence.leases does not
/// follow it.
#[test]
fn a_forged_event_looks_real_and_fence_leases_tells_the_truth() {
    let cluster = Cluster::start("notify_forged", 26602, &[]);
    let mut admin = cluster.connect();
    admin.batch_execute("CREATE ROLE forger LOGIN; SET pg_fence.notify = on").unwrap();
    set_fence_setting(&mut admin, "notify_keys", "on");
    let mut listener = cluster.connect();
    listener.batch_execute("LISTEN pg_fence").unwrap();
    let fence = acquire(&mut admin, "job", "1 minute").expect("the key is free").fence;
    let real = received(&mut listener);
    assert!(real.len() == 1 && event(&real[0], "acquired", "job", fence), "{real:?}");

    // The forger needs the fence: the real event told it, as it tells every role that LISTENs.
    let mut forger = cluster.connect_as("forger");
    let forgery = format!(r#"NOTIFY pg_fence, '{{"event":"revoked","fence":{fence},"key":"job"}}'"#);
    forger.batch_execute(&forgery).unwrap();
    let forged = received(&mut listener);
    assert!(forged.len() == 1 && event(&forged[0], "revoked", "job", fence), "{forged:?}");

    let live: bool =
        listener.query_one("SELECT live FROM fence.leases WHERE key = 'job'", &[]).unwrap().get(0);
    assert!(live, "the lease the forged event called revoked is live");
}

/// Every role may LISTEN on channel pg_fence, including a role refused fence.leases: unless a
/// superuser turns pg_fence.notify_keys on, an event names its kind and fence, never the key.
#[test]
fn events_name_no_key_unless_a_superuser_says_so() {
    let cluster = Cluster::start("notify_keys", 26603, &[]);
    let mut admin = cluster.connect();
    admin
        .batch_execute("CREATE ROLE outsider LOGIN; CREATE ROLE app LOGIN; GRANT fence_user TO app")
        .unwrap();
    let mut outsider = cluster.connect_as("outsider");
    let refused = outsider.query_one("SELECT count(*) FROM fence.leases", &[]).unwrap_err();
    assert_eq!(pg_fence_integration::sqlstate(&refused), "42501");
    outsider.batch_execute("LISTEN pg_fence").unwrap();
    let mut app = cluster.connect_as("app");
    app.batch_execute("SET pg_fence.notify = on").unwrap();
    let fence = acquire(&mut app, "customer:4711", "1 minute").expect("the key is free").fence;
    let events = received(&mut outsider);
    assert!(events.len() == 1 && events[0].contains(&format!("\"fence\":{fence}")), "{events:?}");
    assert!(!events[0].contains("customer:4711") && !events[0].contains("\"key\""), "{events:?}");
    if edition() == Edition::Sql {
        // The SQL edition's notify_keys is fence.settings' row, which only fence_admin may update:
        // the application's SET makes a placeholder that changes nothing.
        app.batch_execute("SET pg_fence.notify_keys = on").unwrap();
        let fence = acquire(&mut app, "customer:4712", "1 minute").expect("the key is free").fence;
        let events = received(&mut outsider);
        assert!(events.len() == 1 && events[0].contains(&format!("\"fence\":{fence}")), "{events:?}");
        assert!(!events[0].contains("\"key\""), "an application turned keys on itself: {events:?}");
        let err = app
            .execute("UPDATE fence.settings SET value = 'on' WHERE name = 'notify_keys'", &[])
            .unwrap_err();
        assert_eq!(pg_fence_integration::sqlstate(&err), "42501", "an application turned keys on itself");
        return;
    }
    let err = app.batch_execute("SET pg_fence.notify_keys = on").unwrap_err();
    assert_eq!(pg_fence_integration::sqlstate(&err), "42501", "an application turned keys on itself");
}
