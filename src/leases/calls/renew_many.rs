//! lease_renew_many: many leases, each with its own key, token and TTL, renewed in one call and one
//! commit, each with its own answer; for a client that keeps many leases over few connections.
//!
//! Each renewal is lease_renew's (see `holder::renew_checked`), and takes its key's lock until the
//! transaction ends: the leases are renewed in one order (by key, then token), so that two calls
//! renewing some of the same keys never wait for each other in a circle.
use super::holder::renew_checked;
use crate::leases::state::durability;
use crate::pg::input;
use crate::stats::{self, Counter};
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::prelude::*;
use pgrx::Uuid;

/// Renews the lease each token holds of its key for its TTL: a row per lease, in the order given,
/// with its new expiry, or NULL when that token no longer holds a live lease of the key (what
/// lease_renew reports as PF001; lease_status says why). Nothing fails for one lease lost.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
#[allow(clippy::type_complexity)] // pg_extern needs the row type spelled out, not an alias
fn lease_renew_many(
    keys: Option<Vec<Option<String>>>,
    tokens: Option<Vec<Option<Uuid>>>,
    ttls: Option<Vec<Option<Interval>>>,
) -> TableIterator<
    'static,
    (name!(key, String), name!(token, Uuid), name!(expires_at, Option<TimestampWithTimeZone>)),
> {
    let leases = input::renewals(keys, tokens, ttls);
    durability::require_writable("renew leases");
    let mut order: Vec<usize> = (0..leases.len()).collect();
    order.sort_by(|&a, &b| {
        (&leases[a].0, leases[a].1.as_bytes()).cmp(&(&leases[b].0, leases[b].1.as_bytes()))
    });
    let mut renewed = vec![None; leases.len()];
    for i in order {
        let (key, token, ttl) = &leases[i];
        renewed[i] = renew_checked(key, *token, *ttl);
        stats::bump(if renewed[i].is_some() { Counter::Renewals } else { Counter::RenewalsLost });
    }
    let rows: Vec<_> = leases
        .into_iter()
        .zip(renewed)
        .map(|((key, token, _), expires_at)| (key, token, expires_at))
        .collect();
    TableIterator::new(rows)
}
