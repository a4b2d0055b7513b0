//! Optimistic concurrency without any lock: versioned_update and the versioning trigger
//! (sql/occ.sql). A version mismatch is SQLSTATE 40001, so standard client retry loops apply.
use crate::json_object::JsonArg;
use crate::row_update::RowUpdate;
use crate::spi_plans::execute;
use crate::{errors, input};
use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReportable;
use pgrx::prelude::*;

/// Core of fence.versioned_update: updates the one row matching `filter` if its version is
/// `expected_version`, sets the version to expected + 1 and returns it.
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
    // Lock the matching rows first: then the version seen is the latest, and stays so until commit.
    let current = update.select_sql(&format!("t.{column}::pg_catalog.int8"), "") + " LIMIT 2 FOR UPDATE";
    let write = update.update_sql(
        &format!("{column} = t.{column} OPERATOR(pg_catalog.+) 1"),
        &format!("t.{column} OPERATOR(pg_catalog.=) $3"),
        &format!("t.{column}::pg_catalog.int8"),
    );
    let args = update.arguments(changes.as_ref(), filter.as_ref(), Some(expected));
    let found: Vec<Option<i64>> =
        execute(&current, &args, |rows| rows.map(|row| row.get::<i64>(1).unwrap_or_report()).collect());
    match found.as_slice() {
        [] => errors::no_row(update.table()),
        [Some(version)] if *version == expected => {}
        [actual] => errors::version_mismatch(update.table(), expected, *actual),
        _ => errors::not_one_row(update.table(), found.len()),
    }
    let written: Vec<Option<i64>> =
        execute(&write, &args, |rows| rows.map(|row| row.get::<i64>(1).unwrap_or_report()).collect());
    match written.as_slice() {
        [Some(version)] => *version,
        // A BEFORE trigger of the caller's skipped the row.
        [] => errors::no_row(update.table()),
        // A new row matching the filter, at the same version, committed between the two statements.
        _ => errors::not_one_row(update.table(), written.len()),
    }
}
