//! The SQL functions that act on leases; the top layer of leases/, above `line` and `state`.
//! Nothing below imports from here.
//!
//! - `steps`: what every call that changes a key does first (lock only when it can succeed);
//! - `request` (what an acquire asks for, and the lease it returns), `grant` (the grant under the
//!   key lock), `handoff` (lease_handoff, and the waiting candidate's claim), `acquire`
//!   (lease_acquire, waiting in line), `sets` (lease_acquire_all and its kin), in that order of
//!   imports;
//! - `holder` (lease_renew, lease_release), `renew_many` (lease_renew_many, on `holder`),
//!   `first_free` (lease_acquire_any, on `acquire`), `revoke`, `proclaim`, `observe`
//!   (await_change), `status` (current_fence, lease_status).
pub mod acquire;
pub mod first_free;
pub mod grant;
pub mod handoff;
pub mod holder;
pub mod observe;
pub mod proclaim;
pub mod renew_many;
pub mod request;
pub mod revoke;
pub mod sets;
pub mod status;
pub mod steps;
