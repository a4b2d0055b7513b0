//! pg_fence: leases with fencing tokens, kept and enforced inside PostgreSQL.
//!
//! Where to look:
//! - `leases`: lease_acquire / lease_renew / lease_release / current_fence, the heart of it.
//! - `keylock`: the per-key advisory lock that serializes every change to one key.
//! - `durability`: what a transaction that grants or renews must guarantee at commit.
//! - `input`: argument checks shared by every function; `errors`: how they fail.
//! - `settings`: the `pg_fence.*` GUCs.
//! - `sql/`: the tables, types and views (schema.sql) and the SQL shells that raise pg_fence's own
//!   SQLSTATEs (api.sql).
use pgrx::prelude::*;

mod durability;
mod errors;
mod input;
mod keylock;
mod leases;
mod settings;
mod spi_plans;

#[cfg(any(test, feature = "pg_test"))]
mod pg_tests;

::pgrx::pg_module_magic!(name, version);

extension_sql_file!("../sql/schema.sql", name = "schema", bootstrap);
extension_sql_file!("../sql/api.sql", name = "api", finalize);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    settings::init();
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
