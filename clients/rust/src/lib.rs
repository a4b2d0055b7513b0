//! Client for pg_fence: distributed leases with fencing tokens, granted by PostgreSQL.
//!
//! - [`lease`]: the SQL API, one statement per call, on any client or transaction.
//! - [`FenceClient`]: the same calls with reconnects and retries (backoff with full jitter); a retried
//!   acquire is safe because its token is chosen before the first try.
//! - [`hold`]: acquire and keep a lease renewed in the background, with a local deadline that says
//!   when to stop even if the server cannot be reached; a shared lease or a semaphore's permit
//!   ([`AcquireOptions::shared`], [`AcquireOptions::permits`]) the same way; [`hold_all`] a lease set.
//!   A lost lease is told with its [`LossReason`].
//! - [`FenceClient::hold`] (and `hold_first_free`, `hold_all`, [`FenceClient::elector`]): the same,
//!   kept by the client's one keeper, which renews every lease it keeps over a few connections of
//!   its own (`keeper_connections`, 2 by default), the renewals due together sent in one call
//!   (`fence.lease_renew_many`); an acquire given up after it may have been granted releases its
//!   token there. [`KeeperStats`] says how it has gone.
//! - [`Elector`]: leader election on a key: campaign with a value, resign, proclaim, observe the
//!   leaders as a stream, hand off to a named candidate, callbacks on started and stopped leading and
//!   on a new leader.
//!
//! Whatever the client believes, only the fence protects the data: guard every write with
//! [`lease::fence_guard`] or [`lease::fenced_update`] in the writing transaction.
mod client;
mod clock;
mod connect;
mod elector;
mod error;
mod keeper;
pub mod lease;
mod reason;
mod renewer;
mod retry;

pub use client::FenceClient;
pub use connect::{Connector, PgConnection, TlsConfig, APPLICATION_NAME};
pub use elector::{ElectOptions, Elector, Leadership, Observer, StopReason};
pub use error::{BoxError, Error};
pub use keeper::{
    hold, hold_all, hold_first_free, Held, HeldLease, HeldLeaseSet, KeepOptions, LeaseState, OnLost,
};
pub use lease::{AcquireOptions, Leader, Lease, LeaseSet, LeaseStatus};
pub use reason::LossReason;
pub use renewer::KeeperStats;
pub use retry::Backoff;
