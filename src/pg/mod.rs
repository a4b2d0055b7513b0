//! PostgreSQL plumbing that every concept uses and that knows nothing of leases: the server's clock,
//! the pg_fence.* settings, statements prepared once per backend, how errors are raised (PostgreSQL's
//! and pg_fence's own PF class), argument checks, what differs between major versions, which
//! version's SQL objects are installed (kept per backend until the catalogs change), reading a table's
//! one row without a statement, shared memory sized by the settings, and the backend's latch that
//! every wait sleeps on.
//!
//! Depends on nothing else in the crate.
pub mod catalog_changes;
pub mod clock;
pub mod compat;
pub mod errors;
pub mod input;
pub mod installed;
pub mod latch;
pub mod one_row;
pub mod own_errors;
pub mod settings;
pub mod shmem;
pub mod spi_plans;
pub mod subtransaction;
