//! lease_acquire_any: the first free key of a list, in one call, as SKIP LOCKED takes the first free
//! row: for worker pools whose workers each want one item of many, and any will do.
//!
//! Each key is tried as lease_acquire tries it without `wait` (see `acquire::grant_unless_held`): a
//! key held, waited for, being changed or written under by another transaction is passed over at
//! once, never waited for (a sweep's change of it is waited out: the key is free then). A try that
//! fails leaves nothing locked, so the call ends holding one key's lock at most, whatever the
//! length of the list.
use super::acquire::lease_held_with;
use super::request::Request;
use crate::leases::state::durability;
use crate::leases::state::kinds::Kind;
use crate::leases::state::mode::LeaseMode;
use crate::pg::input;
use crate::stats::{self, Counter};
use pgrx::datum::Interval;
use pgrx::prelude::*;
use pgrx::Uuid;

/// Grants the first key of `keys`, in their order, that lease_acquire would grant at once, with an
/// exclusive lease for `ttl`; NULL when none is free. With `token`, a retry whose reply was lost
/// gets the lease that token holds of one of the keys, unchanged.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
fn lease_acquire_any(
    keys: Option<Vec<Option<String>>>,
    ttl: Option<Interval>,
    owner: default!(Option<&str>, "NULL"),
    session_bound: default!(Option<bool>, "false"),
    durable: default!(Option<bool>, "true"),
    token: default!(Option<Uuid>, "NULL"),
) -> Option<pgrx::composite_type!('static, "lease")> {
    let keys = input::key_list(keys);
    let (ttl, owner) = (input::ttl(ttl), input::owner(owner));
    let session_bound = input::required(session_bound, "session_bound");
    let kind = Kind::of(input::required(durable, "durable"));
    let token = token.map(input::token);
    durability::require_writable("acquire a lease");
    let wal_before = durability::wal_position();
    if let Some(lease) = token.and_then(|token| keys.iter().find_map(|key| lease_held_with(key, token, None)))
    {
        durability::skip_flush_if_alone(wal_before);
        return Some(lease);
    }
    let lease = keys.iter().find_map(|key| {
        Request::new(key, ttl, owner.clone(), session_bound, kind, token, LeaseMode::EXCLUSIVE)
            .grant_unless_held(None)
    });
    if lease.is_none() || kind == Kind::Fast {
        durability::skip_flush_if_alone(wal_before);
    }
    stats::bump(match (&lease, kind) {
        (None, _) => Counter::AcquiresRefused,
        (Some(_), Kind::Durable) => Counter::GrantsDurable,
        (Some(_), Kind::Fast) => Counter::GrantsFast,
    });
    lease
}
