//! pg_fence: leases with fencing tokens, kept and enforced inside PostgreSQL.
//!
//! The tree is the map: `leases` (who holds a key, under which fence), `writes` (writes a stale
//! holder cannot make), `locks` (the advisory locks behind both), `sweeper` (tidying ended leases,
//! and its background worker, which also bounds how long a guard may hold back a grant), `stats`
//! (the counters of fence.stats) and `pg` (PostgreSQL plumbing). Each folder's mod.rs says what it holds and what may depend on it. `sql/` holds the
//! tables, types and views (schema.sql) and, per concept, the functions written in SQL or declared
//! over C entry points.
use pgrx::prelude::*;

mod pg;
#[macro_use]
mod leases;
mod locks;
mod stats;
mod sweeper;
mod writes;

#[cfg(any(test, feature = "pg_test"))]
mod pg_tests;

::pgrx::pg_module_magic!(name, version);

extension_sql_file!("../sql/schema.sql", name = "schema", bootstrap);
extension_sql_file!(
    "../sql/leases.sql",
    name = "leases",
    requires = [
        leases::calls::holder::renew_if_held,
        leases::calls::sets::renew_all_if_held,
        leases::state::session_lock::holder_alive,
        leases::state::memory::view::fast_lease_rows
    ]
);
extension_sql_file!(
    "../sql/fencing.sql",
    name = "fencing",
    requires = [writes::fencing::fence_holds, writes::fencing::update_matching]
);
extension_sql_file!("../sql/occ.sql", name = "occ", requires = [writes::occ::update_versioned_row]);
extension_sql_file!("../sql/stats.sql", name = "stats", requires = [stats::stats_values]);
extension_sql_file!(
    "../sql/internal.sql",
    name = "internal",
    requires = ["leases", "fencing", "occ", "stats", writes::occ::checked_version]
);
extension_sql_file!("../sql/privileges.sql", name = "privileges", finalize);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    no_rust_backtraces_in_errors();
    pg::settings::init();
    stats::init();
    leases::state::memory::init();
    sweeper::launcher::register();
}

/// pgrx attaches a Rust backtrace to the DETAIL of an error it passes on whenever
/// `Backtrace::capture` says to, which RUST_BACKTRACE=1 in the server's environment does: a client
/// would then read pg_fence's internals in every cancelled wait. RUST_LIB_BACKTRACE decides for
/// `Backtrace::capture` ahead of RUST_BACKTRACE (which still governs panic messages in the log).
fn no_rust_backtraces_in_errors() {
    // A backend, and the postmaster loading preloaded libraries, run one thread: nothing reads the
    // environment meanwhile.
    std::env::set_var("RUST_LIB_BACKTRACE", "0");
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
