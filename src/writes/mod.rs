//! Writes a stale holder cannot make: fence_guard, fenced_update and fenced_write (`fencing`), and
//! optimistic concurrency without leases, versioned_update (`occ`). Both build one UPDATE from the
//! caller's jsonb (`row_update`, over `json_object` and `table_facts`).
//!
//! Depends on leases/ (to read a key's lease: `leases::state::rows`), locks/ and pg/; nothing depends on it.
pub mod fencing;
mod json_object;
pub mod occ;
mod row_update;
mod table_facts;
