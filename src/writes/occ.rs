//! Optimistic concurrency without any lock: versioned_update and the versioning trigger
//! (sql/occ.sql). A version mismatch is SQLSTATE 40001, so standard client retry loops apply.
use crate::pg::errors;
use crate::pg::input;
use crate::pg::installed;
use crate::pg::spi_plans::execute;
use crate::writes::json_object::JsonArg;
use crate::writes::row_update::RowUpdate;
use crate::writes::table_facts;
use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReportable;
use pgrx::prelude::*;

/// Core of fence.versioned_update: updates the one row matching `filter` if its version is
/// `expected_version`, sets the version to expected + 1 and returns it.
///
/// As fenced_write does (src/writes/fencing.rs), it first locks and checks the matching rows, waiting for
/// every writer still changing one, then writes with a new snapshot, checking each row again in the
/// version it overwrites (fence.checked_version computes the new version): the rows checked are the
/// rows written, also when one came to match the filter in between.
#[pg_extern(volatile, parallel_unsafe)]
fn update_versioned_row(
    target: Option<pg_sys::Oid>,
    version_column: Option<&str>,
    expected_version: Option<i64>,
    changes: Option<JsonArg>,
    filter: Option<JsonArg>,
) -> i64 {
    let update = RowUpdate::new("versioned_update", target, changes.as_ref(), filter.as_ref());
    let column = update.counter_column("version_column", version_column);
    let expected = input::required(expected_version, "expected_version");
    let current = update.select_sql(&format!("t.{column}::pg_catalog.int8"), "") + " LIMIT 2 FOR UPDATE";
    let returning = format!("t.{column}::pg_catalog.int8");
    let write = if installed::since_0_4_0() {
        update.update_sql(
            // The table's OID as a constant: the plan is the table's own anyway, and t.tableoid would
            // need SELECT on the whole table, where the caller may have it on some columns only.
            &format!(
                "{column} = fence.checked_version({}::pg_catalog.oid, t.{column}, $3)",
                update.relid().to_u32()
            ),
            "",
            &returning,
        )
    } else {
        // Over the objects of a version before 0.4.0, which have no checked_version: the write of
        // those versions, until ALTER EXTENSION UPDATE.
        update.update_sql(
            &format!("{column} = t.{column} OPERATOR(pg_catalog.+) 1"),
            &format!("t.{column} OPERATOR(pg_catalog.=) $3"),
            &returning,
        )
    };
    let args = update.arguments(changes.as_ref(), filter.as_ref(), Some(expected));
    let found: Vec<Option<i64>> =
        execute(&current, &args, |rows| rows.map(|row| row.get::<i64>(1).unwrap_or_report()).collect());
    match found.as_slice() {
        // None yet: the write's newer snapshot may still find one (a row deleted and inserted again).
        [] => {}
        [Some(version)] if *version == expected => {}
        [actual] => errors::version_mismatch(update.table(), expected, *actual),
        _ => errors::not_one_row(update.table(), found.len()),
    }
    let written: Vec<Option<i64>> =
        execute(&write, &args, |rows| rows.map(|row| row.get::<i64>(1).unwrap_or_report()).collect());
    match written.as_slice() {
        [Some(version)] => *version,
        // No row, or a BEFORE trigger of the caller's skipped it.
        [] => errors::no_row(update.table()),
        // Rows matching the filter, at the expected version, that committed between the statements.
        _ => errors::not_one_row(update.table(), written.len()),
    }
}

/// fence.checked_version(target, row_version, expected), which versioned_update's UPDATE calls for
/// each row it writes: the row's next version, expected + 1, when the row is at `expected`;
/// otherwise a version conflict (40001), which rolls back the whole statement.
#[pg_extern(volatile, parallel_unsafe)]
fn checked_version(target: Option<pg_sys::Oid>, row_version: Option<i64>, expected: Option<i64>) -> i64 {
    let expected = input::required(expected, "expected");
    let table = || target.and_then(table_facts::qualified_name).unwrap_or_else(|| "<NULL>".into());
    if row_version != Some(expected) {
        errors::version_mismatch(&table(), expected, row_version);
    }
    expected.checked_add(1).unwrap_or_else(|| errors::version_overflow(&table()))
}
