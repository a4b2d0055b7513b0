//! What a lease is and where it is stored; the bottom layer of leases/, which imports nothing from
//! `line` or `calls`.
//!
//! - the lease: `kinds` (durable or fast), `mode` (exclusive, shared, semaphore) and `slots` (where
//!   a grant goes among the key's rows), `found` (what a read finds), `liveness` (the SQL rule of a
//!   live lease), `ended` (how a lease ended, and lock-delay), `token` (a token as stored);
//! - where it is stored: `rows` (a key's rows of both kinds, from whichever store holds them),
//!   `table_rows` (the tables, read without a statement), `memory` (fast leases in shared memory),
//!   `session_lock` (the lock whose holder keeps a session-bound lease alive);
//! - fences and commits: `fences` (how a grant's fence is chosen, and the floors under it),
//!   `high_water` (deleted rows' fences), `durability` (which commits wait for a flush).
#[macro_use]
mod liveness;
#[macro_use]
pub mod kinds;
#[macro_use]
pub mod ended;

pub mod durability;
pub mod fences;
pub mod found;
pub mod high_water;
pub mod memory;
pub mod mode;
pub mod rows;
pub mod session_lock;
pub mod slots;
pub mod table_rows;
pub mod token;
