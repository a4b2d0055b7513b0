//! The fast leases' rows of the view fence.leases, from shared memory or from the unlogged table,
//! wherever they live here (see `changes::in_use`).
use super::changes;
use crate::pg::clock;
use crate::pg::spi_plans::execute;
use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys::panic::ErrorReportable;
use pgrx::prelude::*;

/// The table's rows but the reset marker (see `fences`), live by `live_at!` at the clock's now.
const TABLE_ROWS: &str = "
    SELECT l.key, l.owner, l.fence, l.acquired_at, l.expires_at, l.session_pid,
           (l.token_hash IS NOT NULL AND l.expires_at > pg_catalog.clock_timestamp()
            AND (l.session_id IS NULL OR coalesce(fence.holder_alive(l.session_pid, l.session_id), false))),
           l.shared, l.permits
      FROM fence.fast_lease_state l
     WHERE l.key <> ''";

type ViewRow =
    (String, String, i64, TimestampWithTimeZone, TimestampWithTimeZone, Option<i32>, bool, bool, i32);

/// pg_fence internal: the fast leases' rows for view fence.leases. A standby has none.
#[pg_extern(stable, parallel_unsafe, security_definer)]
#[search_path(pg_catalog, pg_temp)]
#[allow(clippy::type_complexity)]
fn fast_lease_rows() -> TableIterator<
    'static,
    (
        name!(key, String),
        name!(owner, String),
        name!(fence, i64),
        name!(acquired_at, TimestampWithTimeZone),
        name!(expires_at, TimestampWithTimeZone),
        name!(session_pid, Option<i32>),
        name!(live, bool),
        name!(shared, bool),
        name!(permits, i32),
    ),
> {
    // SAFETY: reads shared recovery state.
    if unsafe { pg_sys::RecoveryInProgress() } {
        return TableIterator::new(Vec::new());
    }
    if !changes::in_use() {
        return TableIterator::new(execute(TABLE_ROWS, &[], |rows| rows.map(table_row).collect::<Vec<_>>()));
    }
    let now = clock::now();
    let rows = changes::all_rows().into_iter().map(|(key, row)| {
        let live = changes::found_one(&row, now).live.is_some();
        let stamp = clock::timestamp;
        let session = row.session.map(|(pid, _)| pid);
        (
            key,
            row.owner().to_owned(),
            row.fence,
            stamp(row.acquired_at),
            stamp(row.expires_at),
            session,
            live,
            row.shared,
            row.permits,
        )
    });
    TableIterator::new(rows.collect::<Vec<ViewRow>>())
}

fn table_row(row: pgrx::spi::SpiHeapTupleData) -> ViewRow {
    (
        row.get(1).unwrap_or_report().unwrap_or_default(),
        row.get(2).unwrap_or_report().unwrap_or_default(),
        row.get(3).unwrap_or_report().unwrap_or_default(),
        row.get(4).unwrap_or_report().unwrap_or_else(|| clock::timestamp(0)),
        row.get(5).unwrap_or_report().unwrap_or_else(|| clock::timestamp(0)),
        row.get(6).unwrap_or_report(),
        row.get(7).unwrap_or_report().unwrap_or_default(),
        row.get(8).unwrap_or_report().unwrap_or_default(),
        row.get(9).unwrap_or_report().unwrap_or(1),
    )
}
