//! What happens around a lease without being one; the middle layer of leases/, which imports from
//! `state` and never from `calls`.
//!
//! - `waiting`: the queue of acquirers waiting for a key, in arrival order;
//! - `wakeups`: waking a key's head waiter and observers once a change has committed;
//! - `sessions`: the session lock a session-bound lease's holder keeps, and what its exit ends;
//! - `notify`: NOTIFY on a key's grants and releases.
pub mod notify;
pub mod sessions;
pub mod waiting;
pub mod wakeups;
