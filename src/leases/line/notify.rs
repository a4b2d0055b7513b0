//! Lease events for applications that LISTEN: NOTIFY on channel `pg_fence` with a JSON payload
//! {"event": "acquired"|"released"|"expired"|"revoked", "fence": ...}, and "key" only when
//! pg_fence.notify_keys is on: PostgreSQL lets every role LISTEN on every channel, and keys are
//! often business identifiers that a role refused fence.leases must not read. A listener that
//! watches its own keys compares the event's fence with current_fence(key). PostgreSQL delivers
//! notifications when the transaction commits, and never for one that rolled back. Off unless
//! pg_fence.notify is on: a NOTIFY is not free (see settings).
use crate::pg::settings;
use pgrx::prelude::*;

pub const CHANNEL: &str = "pg_fence";

#[derive(Clone, Copy)]
pub enum Event {
    Acquired,
    Released,
    Expired,
    Revoked,
}

impl Event {
    fn name(self) -> &'static str {
        match self {
            Event::Acquired => "acquired",
            Event::Released => "released",
            Event::Expired => "expired",
            Event::Revoked => "revoked",
        }
    }
}

/// Announces the change when pg_fence.notify is on.
pub fn send(event: Event, key: &str, fence: i64) {
    if !settings::notify() {
        return;
    }
    let payload = if settings::notify_keys() {
        serde_json::json!({ "event": event.name(), "key": key, "fence": fence })
    } else {
        serde_json::json!({ "event": event.name(), "fence": fence })
    }
    .to_string();
    // SAFETY: pg_notify(text, text) reads only its two non-NULL arguments.
    unsafe {
        pgrx::direct_function_call_as_datum(pg_sys::pg_notify, &[CHANNEL.into_datum(), payload.into_datum()]);
    }
}
