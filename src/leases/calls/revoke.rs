//! Administration: lease_revoke, for superusers and members of role fence_admin (sql/privileges.sql
//! creates the role and grants EXECUTE to it alone).
use super::steps::{lock_key_if_it_can_succeed, unseen_by_the_statement};
use crate::leases::line::notify::{self, Event};
use crate::leases::line::wakeups;
use crate::leases::state::durability;
use crate::leases::state::ended;
use crate::leases::state::found::Live;
use crate::leases::state::kinds::Kind;
use crate::leases::state::memory;
use crate::leases::state::rows;
use crate::locks::keylock::{self, Mode};
use crate::pg::clock;
use crate::pg::input;
use crate::pg::spi_plans::execute;
use crate::stats::{self, Counter};
use pgrx::prelude::*;

/// Ends the key's live leases, whoever holds them; expires_at becomes the moment they ended,
/// recorded as a revocation (see `state::ended`).
macro_rules! revoke {
    ($table:literal) => {
        revoke!($table, concat!(", ", record_end!("'revoked'", "$2")))
    };
    ($table:literal, before_0_5_0) => {
        revoke!($table, "")
    };
    ($table:literal, $record:expr) => {
        concat!(
            "UPDATE ",
            $table,
            " SET token_hash = NULL, expires_at = $2",
            $record,
            " WHERE key = $1 AND ",
            live_at!("$2"),
            " RETURNING fence"
        )
    };
}

/// The key's rows of leases that are not live lose their lock-delay (an UPDATE of one table).
macro_rules! lift_lock_delay {
    ($table:literal) => {
        concat!(
            "UPDATE ",
            $table,
            " SET lock_delay = 0 WHERE key = $1 AND lock_delay > 0 AND NOT ",
            live_at!("$2")
        )
    };
}

/// Ends the key's live leases now, every holder's of every mode: true when there was one. Their
/// holders' fences become stale (fenced writes refuse them) and their renew and release fail; the
/// next grant gets a higher fence. A key with no live lease but a lock-delay running (after an
/// expiry, a revocation, a session's end) has the delay lifted: true too.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn lease_revoke(key: Option<&str>) -> bool {
    let key = input::key(key);
    durability::require_writable("revoke a lease");
    let held_back = |now| ended::held_back_until(&rows::all_with_ends(key, now), now, |_| now).is_some();
    let can_succeed = |now| rows::live(key, now).next().is_some() || held_back(now);
    if !lock_key_if_it_can_succeed(key, Mode::Change, can_succeed) {
        return false;
    }
    let now = clock::now();
    if rows::live(key, now).next().is_none() {
        return lift_held_back(key, now, held_back(now));
    }
    let args = [key.into(), clock::timestamp(now).into()];
    let live: Vec<Live> = rows::live(key, now).collect();
    let mut revoked: Vec<i64> = Vec::new();
    for kind in [Kind::Durable, Kind::Fast] {
        if !live.iter().any(|lease| lease.kind == kind) {
            continue;
        }
        if kind == Kind::Fast && memory::changes::in_use() {
            revoked.extend(memory::changes::revoke(key, now));
            continue;
        }
        revoked.extend(execute(by_objects!(kind, revoke), &args, |rows| {
            rows.filter_map(|row| row.get::<i64>(1).ok().flatten()).collect::<Vec<_>>()
        }));
        // An administrator acts on what it sees: a revocation must not come back after a crash
        // (which ends a fast lease anyway).
        if kind == Kind::Durable {
            durability::require_durable_commit();
        }
    }
    if revoked.is_empty() {
        if !live.is_empty() {
            unseen_by_the_statement();
        }
        keylock::unlock(key, Mode::Change);
        return false;
    }
    wakeups::wake_at_commit(key);
    for fence in &revoked {
        notify::send(Event::Revoked, key, *fence);
    }
    stats::add(Counter::Revocations, revoked.len() as u64);
    true
}

/// Lifts the key's lock-delay, if one holds it back (`held_back`); the caller holds the key's lock.
fn lift_held_back(key: &str, now: i64, held_back: bool) -> bool {
    if held_back {
        if memory::changes::in_use() {
            memory::changes::lift_lock_delay(key, now);
        }
        let args = [key.into(), clock::timestamp(now).into()];
        for kind in [Kind::Durable, Kind::Fast] {
            if kind == Kind::Durable || !memory::changes::in_use() {
                execute(by_kind!(kind, lift_lock_delay), &args, |_| ());
            }
        }
        durability::require_durable_commit();
        wakeups::wake_at_commit(key);
    } else {
        keylock::unlock(key, Mode::Change);
    }
    held_back
}
