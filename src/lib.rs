//! pg_fence: leases with fencing tokens, kept and enforced inside PostgreSQL.
//!
//! Where to look:
//! - `leases`: lease_acquire / lease_renew / lease_release / current_fence, the heart of it;
//!   `lease_kinds`: durable leases and fast (unlogged) ones, and what they share.
//! - `fence_numbers`: how a grant's fence is chosen, so that no fence is ever issued twice on any
//!   history the server is rolled onto.
//! - `keylock`: the per-key advisory lock that serializes every change to one key (and the other
//!   advisory locks pg_fence takes); `key_hash`: the secret-keyed hash that names a key's locks.
//! - `durability`: what a transaction that grants or renews must guarantee at commit.
//! - `input`: argument checks shared by every function; `errors`: how they fail.
//! - `installed`: which version's SQL objects the schema holds, for a library newer than them.
//! - `fencing`: fence_guard, fenced_update, fenced_write: writes that a stale holder cannot make.
//! - `occ`: versioned_update, optimistic concurrency without locks.
//! - `row_update`: the UPDATE statements those build from the caller's jsonb.
//! - `admin`: lease_revoke, for role fence_admin (sql/privileges.sql says who may call what). `notify`: the NOTIFY events of lease changes.
//! - `liveness`: the one condition for "this lease is live" (in SQL; `lease_row` has it in Rust);
//!   `clock`: the server's clock, as liveness must read it.
//! - `waiting`: lease_acquire's `wait`, a queue per key and prompt wake-ups.
//! - `sessions`: session-bound leases, which end with the session that took them.
//! - `sweeper`: fence.sweep(), which marks expired leases free and deletes long-ended ones;
//!   `worker`: the background worker that calls it.
//! - `stats`: the counters of fence.stats, in shared memory (with shared_preload_libraries).
//! - `compat`: what differs between PostgreSQL 15, 17 and 18, in one place.
//! - `settings`: the `pg_fence.*` GUCs; `spi_plans`: statements prepared once per backend.
//! - `own_errors`: raising pg_fence's own SQLSTATEs (class PF) from Rust, for the fenced writes.
//! - `lease_row`: a key's lease row read from its index without a statement, for the guard.
//! - `sql/`: the tables, types and views (schema.sql), and per concept the public functions written
//!   in SQL (lease_renew's shell, which raises PF001, and the versioning trigger) or declared over
//!   C entry points (the fenced writes).
use pgrx::prelude::*;

#[macro_use]
mod liveness;
#[macro_use]
mod lease_kinds;

mod admin;
mod clock;
mod compat;
mod durability;
mod errors;
mod fence_numbers;
mod fencing;
mod input;
mod installed;
mod json_object;
mod key_hash;
mod keylock;
mod lease_row;
mod leases;
mod notify;
mod occ;
mod one_row;
mod own_errors;
mod row_update;
mod sessions;
mod settings;
mod spi_plans;
mod stats;
mod sweeper;
mod table_facts;
mod waiting;
mod worker;

#[cfg(any(test, feature = "pg_test"))]
mod pg_tests;

::pgrx::pg_module_magic!(name, version);

extension_sql_file!("../sql/schema.sql", name = "schema", bootstrap);
extension_sql_file!(
    "../sql/leases.sql",
    name = "leases",
    requires = [leases::renew_if_held, sessions::holder_alive]
);
extension_sql_file!(
    "../sql/fencing.sql",
    name = "fencing",
    requires = [fencing::fence_holds, fencing::update_matching]
);
extension_sql_file!("../sql/occ.sql", name = "occ", requires = [occ::update_versioned_row]);
extension_sql_file!("../sql/stats.sql", name = "stats", requires = [stats::stats_values]);
extension_sql_file!("../sql/privileges.sql", name = "privileges", finalize);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    settings::init();
    stats::init();
    worker::register();
}

/// Required by `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
