//! Leases: who holds a key, until when, under which fence. Three layers, each a folder; a file
//! imports from its own layer and the ones below it, never from one above:
//!
//! - `calls` (top): the SQL functions that act on leases: acquire and the modes' grants, lease
//!   sets, renew and release, hand-off, revoke, proclaim, observe, status. Each call follows the
//!   same steps (`calls::steps`).
//! - `line` (middle): what happens around a lease without being one: the queue of waiting
//!   acquirers, wake-ups of waiters and observers, session-bound leases' sessions, notifications.
//! - `state` (bottom): what a lease is and where it is stored: its rows of both kinds (tables,
//!   shared memory), its mode and slot, its fence and the floors under it, its commit's
//!   durability, how it ended.
//!
//! What may depend on leases/: sweeper/ (it tidies the rows of leases that have already ended, with
//! `state`), writes/ (they read a lease's row and liveness, `state::rows`, but never change one).
//! leases/ itself uses locks/, pg/ and stats.
#[macro_use]
pub mod state;
pub mod calls;
pub mod line;
