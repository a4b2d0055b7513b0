//! The high-water mark of the fences the sweep deleted, table fence.high_water: a key whose rows
//! were deleted is granted above it (see `fences`), even after a step back of the clock. Raised in
//! the deleting transaction, so that it commits, or is lost, with the deletion.
use crate::pg::installed;
use crate::pg::spi_plans::execute;
use pgrx::FromDatum;

/// The high-water mark, as last committed.
pub fn get() -> Option<i64> {
    let table = installed::table(c"high_water")?;
    // Column 2 is `fence bigint` (sql/schema.sql).
    // SAFETY: a bigint datum of the row.
    crate::pg::one_row::latest(table, |values, nulls| unsafe { i64::from_datum(values[1], nulls[1]) })
        .flatten()
}

/// Raises the mark to `fence`, in this transaction.
pub fn raise(fence: i64) {
    execute(RAISE, &[fence.into()], |_| ());
}

const RAISE: &str = "
    INSERT INTO fence.high_water AS h (one, fence) VALUES (true, $1)
    ON CONFLICT (one) DO UPDATE SET fence = greatest(h.fence, excluded.fence)";
