//! Administration: lease_revoke, for superusers and members of role fence_admin (sql/privileges.sql
//! creates the role and grants EXECUTE to it alone).
use crate::leases::durability;
use crate::leases::kinds::Kind;
use crate::leases::notify::{self, Event};
use crate::leases::row;
use crate::leases::waiting;
use crate::leases::{lock_key_if_it_can_succeed, unseen_by_the_statement};
use crate::locks::keylock::{self, Mode};
use crate::pg::clock;
use crate::pg::input;
use crate::pg::spi_plans::execute;
use crate::stats::{self, Counter};
use pgrx::prelude::*;

/// Ends the key's live leases, whoever holds them; expires_at becomes the moment they ended,
/// recorded as a revocation (see `ended`).
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

/// Ends the key's live leases now, every holder's of every mode: true when there was one. Their
/// holders' fences become stale (fenced writes refuse them) and their renew and release fail; the
/// next grant gets a higher fence.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn lease_revoke(key: Option<&str>) -> bool {
    let key = input::key(key);
    durability::require_writable("revoke a lease");
    if !lock_key_if_it_can_succeed(key, Mode::Change, |now| row::live(key, now).next().is_some()) {
        return false;
    }
    let now = clock::now();
    let args = [key.into(), clock::timestamp(now).into()];
    let live: Vec<row::Live> = row::live(key, now).collect();
    let mut revoked: Vec<i64> = Vec::new();
    for kind in [Kind::Durable, Kind::Fast] {
        if !live.iter().any(|lease| lease.kind == kind) {
            continue;
        }
        if kind == Kind::Fast && super::memory::changes::in_use() {
            revoked.extend(super::memory::changes::revoke(key, now));
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
    waiting::wake_at_commit(key);
    for fence in &revoked {
        notify::send(Event::Revoked, key, *fence);
    }
    stats::add(Counter::Revocations, revoked.len() as u64);
    true
}
