//! What the holder's token may do: the core of lease_renew (whose shell in sql/leases.sql turns
//! "not held" into SQLSTATE PF001) and lease_release. Without the live holder's token neither
//! changes anything, nor waits behind anyone (see `lock_key_if_it_can_succeed`).
use super::steps::{lock_key_if_it_can_succeed, unseen_by_the_statement};
use crate::leases::line::notify::{self, Event};
use crate::leases::line::{sessions, wakeups};
use crate::leases::state::found::Live;
use crate::leases::state::kinds::Kind;
use crate::leases::state::token::token_hash;
use crate::leases::state::{durability, memory, rows};
use crate::locks::keylock::{self, Mode};
use crate::pg::spi_plans::execute_first;
use crate::pg::{clock, input};
use crate::stats::{self, Counter};
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::prelude::*;
use pgrx::Uuid;

/// Extends a live lease held with this token ($2: its hash); a lease that has ended stays ended.
macro_rules! renew {
    ($table:literal) => {
        concat!(
            "UPDATE ",
            $table,
            " SET expires_at = $4 WHERE key = $1 AND token_hash = $2 AND ",
            live_at!("$3"),
            " RETURNING expires_at"
        )
    };
}

/// Ends a live lease held with this token; expires_at becomes the moment it ended, recorded as a
/// release (see `state::ended`).
macro_rules! release {
    ($table:literal) => {
        release!($table, concat!(", ", record_end!("'released'", "$3")))
    };
    ($table:literal, before_0_5_0) => {
        release!($table, "")
    };
    ($table:literal, $record:expr) => {
        concat!(
            "UPDATE ",
            $table,
            " SET token_hash = NULL, expires_at = $3",
            $record,
            " WHERE key = $1 AND token_hash = $2 AND ",
            live_at!("$3"),
            " RETURNING fence"
        )
    };
}

/// Core of fence.lease_renew: the new expiry, or NULL when `token` does not hold a live lease.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn renew_if_held(
    key: Option<&str>,
    token: Option<Uuid>,
    ttl: Option<Interval>,
) -> Option<TimestampWithTimeZone> {
    let key = input::key(key);
    let token = input::required(token, "token");
    let ttl = input::ttl(ttl);
    durability::require_writable("renew a lease");
    let renewed = renew_checked(key, token, ttl);
    stats::bump(if renewed.is_some() { Counter::Renewals } else { Counter::RenewalsLost });
    renewed
}

pub(super) fn renew_checked(key: &str, token: Uuid, ttl: i64) -> Option<TimestampWithTimeZone> {
    let wal_before = durability::wal_position();
    let hash = token_hash(token);
    let kind = lock_key_if_held(key, &hash)?;
    let now = clock::now();
    let Some(held) = rows::held_with_of_kind(kind, key, &hash, now) else {
        keylock::unlock(key, Mode::Change);
        return None;
    };
    let renewed = if held.kind == Kind::Fast && memory::changes::in_use() {
        memory::changes::renew(key, &hash, now, now + ttl).map(clock::timestamp)
    } else {
        let args =
            [key.into(), hash.into(), clock::timestamp(now).into(), clock::timestamp(now + ttl).into()];
        execute_first::<TimestampWithTimeZone>(by_kind!(held.kind, renew), &args)
    };
    let Some(renewed) = renewed else {
        unseen_by_the_statement();
        keylock::unlock(key, Mode::Change);
        return None;
    };
    match held.kind {
        Kind::Durable => durability::require_durable_commit(),
        Kind::Fast => durability::skip_flush_if_alone(wal_before),
    }
    wakeups::wake_at_commit(key); // the lease may now end sooner than its waiter planned
    Some(renewed)
}

/// Ends the lease held with `token`: true when this call ended it, false when that token no longer
/// holds a live lease (already released, taken over, or expired). Safe to retry.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn lease_release(key: Option<&str>, token: Option<Uuid>) -> bool {
    let key = input::key(key);
    let token = input::required(token, "token");
    durability::require_writable("release a lease");
    let released = release_checked(key, token);
    stats::bump(if released { Counter::Releases } else { Counter::ReleasesStale });
    released
}

/// Ends `held`, the lease the token with this hash holds, at `now`: its fence, or None when the
/// statement did not find it live (see `unseen_by_the_statement`). The caller holds the key lock.
pub(super) fn end_held(key: &str, hash: &[u8], held: &Live, now: i64) -> Option<i64> {
    let ended = if held.kind == Kind::Fast && memory::changes::in_use() {
        memory::changes::release(key, hash, now)
    } else {
        let args = [key.into(), hash.to_vec().into(), clock::timestamp(now).into()];
        execute_first::<i64>(by_objects!(held.kind, release), &args)
    };
    if ended.is_none() {
        unseen_by_the_statement();
    }
    ended
}

/// Takes the key's lock if the token holds its lease, as last committed: the kind of that lease.
fn lock_key_if_held(key: &str, hash: &[u8]) -> Option<Kind> {
    let mut kind = None;
    lock_key_if_it_can_succeed(key, Mode::Change, |now| {
        kind = rows::held_with(key, hash, now).map(|held| held.kind);
        kind.is_some()
    });
    kind
}

pub(super) fn release_checked(key: &str, token: Uuid) -> bool {
    let wal_before = durability::wal_position();
    let hash = token_hash(token);
    let Some(kind) = lock_key_if_held(key, &hash) else {
        return false;
    };
    let now = clock::now();
    let held = rows::held_with_of_kind(kind, key, &hash, now);
    let ended_fence = held.and_then(|held| end_held(key, &hash, &held, now));
    match ended_fence {
        Some(fence) => {
            sessions::unbound(key);
            wakeups::wake_at_commit(key);
            notify::send(Event::Released, key, fence);
        }
        None => keylock::unlock(key, Mode::Change),
    }
    durability::skip_flush_if_alone(wal_before);
    ended_fence.is_some()
}
