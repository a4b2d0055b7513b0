//! Fast leases (`durable => false`) in shared memory, with pg_fence preloaded: no transaction id, no
//! heap tuple, no WAL and no commit record for a grant, a renewal or a release, which is what made
//! fast leases in the unlogged table cost two transactions' worth per pair.
//!
//! From the bottom up (each file imports only those before it in this list):
//! - `row`: what a row holds, the columns of fence.fast_lease_state;
//! - `layout`: the fixed table of pg_fence.fast_leases rows and its buckets, sized at server start;
//! - `charges`: rows charged to roles, and the rows transactions have reserved: full, a change is
//!   refused with an error before anything is made;
//! - `shared`: the committed rows, read and changed;
//! - `trace`, `write_set`: a transaction's changes, applied at its commit, dropped at its rollback
//!   (or a rollback to a savepoint), refused at PREPARE TRANSACTION;
//! - `changes`: what a lease call does to a key's rows; `view`: fence.fast_lease_rows.
//!
//! Used by the rest of `state` (`rows`, `fences`), by `calls` and by sweeper/.
//!
//! Like the unlogged table, shared memory is emptied by a crash restart and a standby has none of
//! it, so a crash, an immediate shutdown or a failover ends every fast lease; their fences are kept
//! above by the fast reservation (see `fences`). Without preload, fast leases stay in the table.
pub mod changes;
pub mod charges;
mod layout;
pub mod row;
pub mod shared;
mod trace;
pub mod view;
pub mod write_set;

/// Called from _PG_init.
pub fn init() {
    shared::init();
}
