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
use crate::pg::spi_plans::execute_first;
use crate::stats::{self, Counter};
use pgrx::prelude::*;

/// Ends the live lease, whoever holds it; expires_at becomes the moment it ended.
macro_rules! revoke {
    ($table:literal) => {
        concat!(
            "UPDATE ",
            $table,
            " SET token_hash = NULL, expires_at = $2 WHERE key = $1 AND ",
            live_at!("$2"),
            " RETURNING fence"
        )
    };
}

/// Ends the key's live lease now: true when there was one. Its holder's fence becomes stale (fenced
/// writes refuse it) and its renew and release fail; the next grant gets a higher fence.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn lease_revoke(key: Option<&str>) -> bool {
    let key = input::key(key);
    durability::require_writable("revoke a lease");
    if !lock_key_if_it_can_succeed(key, Mode::Change, |now| row::live(key, now).is_some()) {
        return false;
    }
    let now = clock::now();
    let args = [key.into(), clock::timestamp(now).into()];
    let live = row::live(key, now);
    let revoked = live.and_then(|lease| {
        let fence = execute_first::<i64>(by_kind!(lease.kind, revoke), &args);
        if fence.is_none() {
            unseen_by_the_statement();
        }
        Some((fence?, lease.kind))
    });
    let revoked_fence = revoked.map(|(fence, _)| fence);
    match revoked {
        Some((fence, kind)) => {
            // An administrator acts on what it sees: a revocation must not come back after a crash
            // (which ends a fast lease anyway).
            if kind == Kind::Durable {
                durability::require_durable_commit();
            }
            waiting::wake_at_commit(key);
            notify::send(Event::Revoked, key, fence);
        }
        None => keylock::unlock(key, Mode::Change),
    }
    if revoked_fence.is_some() {
        stats::bump(Counter::Revocations);
    }
    revoked_fence.is_some()
}
