//! How a grant's fence is chosen: the greater of the key's previous fence + 1 and the server clock
//! in microseconds since 1970.
//!
//! "Previous + 1" makes the fences of one history strictly increase whatever the clock does. The
//! clock orders histories: a server rolled onto another history (a promoted standby that missed the
//! last WAL, a cancelled synchronous commit wait, point-in-time recovery, a restored dump, DROP and
//! CREATE EXTENSION) forgets the fences it lost, but its clock has moved on since they were issued,
//! so its next grant is above them. A crash that empties the table of fast leases (see
//! `kinds`) forgets their fences the same way, and the clock puts the next grant above them.
//! The one assumption is that clock: a fence issued on the lost
//! history is at most the clock reading at its grant (plus one per grant of that key within the
//! same microsecond or after a step back), so the new history's clock must read later than that at
//! its first grant of the key (docs/guarantees.md, "Fences, and the one clock assumption").
//!
//! A key's row may be deleted once its lease has ended long enough ago (pg_fence.retain_ended, see
//! `sweeper`). The sweep then raises the durable high-water mark, table fence.high_water, to the
//! deleted fences in the same transaction, and the first grant of a key without a row starts above
//! that mark: so a key granted again gets a fence above its old one even if the clock has stepped
//! back meanwhile. (Over the objects of a version before 0.4.0, which has no such table, a first
//! grant starts at the clock floor alone, and the sweep deletes nothing.)

use pgrx::{pg_sys, FromDatum};

/// Microseconds from 1970-01-01 (the Unix epoch) to 2000-01-01 (PostgreSQL's).
const UNIX_TO_POSTGRES_EPOCH: i64 = 946_684_800_000_000;

/// The lowest fence a grant at clock reading `now` (µs since PostgreSQL's epoch) may get.
pub fn clock_floor(now: i64) -> i64 {
    now.saturating_add(UNIX_TO_POSTGRES_EPOCH)
}

/// A first grant (of a key without a row) made under REPEATABLE READ or SERIALIZABLE read the
/// high-water mark in its snapshot, which may predate a sweep that deleted this key's row and raised
/// the mark above the fence just chosen. Once the INSERT is done, every sweep that deleted an older
/// row of the key has committed (the INSERT waited for it), so the latest committed mark tells.
/// Such a grant fails with 40001 rather than issue a fence twice.
pub fn check_first_grant(fence: i64) {
    // SAFETY: reads the backend's transaction state.
    if unsafe { pg_sys::XactIsoLevel } < pg_sys::XACT_REPEATABLE_READ as i32 {
        return; // READ COMMITTED: the INSERT's own snapshot is taken after such a sweep committed
    }
    let Some(table) = crate::pg::installed::table(c"high_water") else { return };
    // Column 2 is `fence bigint` (sql/schema.sql).
    // SAFETY: a bigint datum of the row.
    let mark =
        crate::pg::one_row::latest(table, |values, nulls| unsafe { i64::from_datum(values[1], nulls[1]) });
    if mark.flatten().is_some_and(|mark| mark >= fence) {
        crate::pg::errors::deleted_since_snapshot();
    }
}
