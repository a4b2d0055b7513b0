//! fence.lease_proclaim: the holder changes the owner its live lease advertises (the leader's
//! address, its version), which observers see (see `observe`).
use super::steps::{lock_key_if_it_can_succeed, unseen_by_the_statement};
use crate::leases::line::wakeups;
use crate::leases::state::kinds::Kind;
use crate::leases::state::token::token_hash;
use crate::leases::state::{durability, memory, rows};
use crate::locks::keylock::{self, Mode};
use crate::pg::spi_plans::execute_first;
use crate::pg::{clock, input};
use pgrx::prelude::*;
use pgrx::Uuid;

/// Changes the owner the live lease held with this hash advertises; returns its fence.
macro_rules! proclaim {
    ($table:literal) => {
        concat!(
            "UPDATE ",
            $table,
            " SET owner = $3 WHERE key = $1 AND token_hash = $2 AND ",
            live_at!("$4"),
            " RETURNING fence"
        )
    };
}

/// Sets the `owner` of the live lease that `token` holds (the leader's advertised value: its
/// address, its version), keeping its fence and expiry: true, or false when that token no longer
/// holds a live lease of the key. Observers see the change.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn lease_proclaim(key: Option<&str>, token: Option<Uuid>, owner: Option<&str>) -> bool {
    let key = input::key(key);
    let token = input::required(token, "token");
    let owner = input::owner(Some(input::required(owner, "owner")));
    durability::require_writable("proclaim a lease's owner");
    let wal_before = durability::wal_position();
    let hash = token_hash(token);
    let holds = |now| rows::held_with(key, &hash, now).is_some();
    if !lock_key_if_it_can_succeed(key, Mode::Change, holds) {
        return false;
    }
    let now = clock::now();
    let Some(held) = rows::held_with(key, &hash, now) else {
        keylock::unlock(key, Mode::Change);
        return false;
    };
    let proclaimed = if held.kind == Kind::Fast && memory::changes::in_use() {
        memory::changes::proclaim(key, &hash, &owner, now)
    } else {
        let args = [key.into(), hash.into(), owner.as_str().into(), clock::timestamp(now).into()];
        execute_first::<i64>(by_kind!(held.kind, proclaim), &args)
    };
    if proclaimed.is_none() {
        unseen_by_the_statement();
        keylock::unlock(key, Mode::Change);
        return false;
    }
    match held.kind {
        Kind::Durable => durability::require_durable_commit(),
        Kind::Fast => durability::skip_flush_if_alone(wal_before),
    }
    wakeups::wake_at_commit(key);
    true
}
