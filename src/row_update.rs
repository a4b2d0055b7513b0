//! "UPDATE target SET <changes> WHERE <filter>" for the fenced and versioned writes, built from the
//! caller's jsonb. Column names are checked against the table and always quoted; values are converted
//! by jsonb_populate_record, exactly as PostgreSQL turns JSON into a row of the table. Statements run
//! with the caller's privileges, so table grants and row-level security apply.
//!
//! In every statement built here, $1 is `changes`, $2 is `filter` (both jsonb) and $3 a bigint
//! (the fence or the expected version).
use crate::errors;
use pgrx::pg_sys;
use pgrx::JsonB;
use std::ffi::{CStr, CString};

pub struct RowUpdate {
    /// The table, schema-qualified and quoted.
    table: String,
    relid: pg_sys::Oid,
    /// Quoted names of the columns to set and of the columns to match.
    changes: Vec<String>,
    filter: Vec<String>,
}

impl RowUpdate {
    /// Checks the arguments every fenced or versioned write shares; `function` names the caller in
    /// error messages.
    pub fn new(function: &str, target: Option<pg_sys::Oid>, changes: Option<&JsonB>, filter: Option<&JsonB>) -> Self {
        let relid = target.unwrap_or_else(|| errors::null_argument("target"));
        let table = table_name(function, relid);
        let changes = columns(relid, &table, "changes", changes, Nulls::Allowed);
        let filter = columns(relid, &table, "filter", filter, Nulls::Refused);
        RowUpdate { table, relid, changes, filter }
    }

    /// A column named by the caller outside the jsonb (fence_column, version_column): it must exist
    /// and hold an integer, and it must not also be among the changes.
    pub fn counter_column(&self, argument: &str, column: Option<&str>) -> String {
        let column = column.unwrap_or_else(|| errors::null_argument(argument));
        let attnum = attnum(self.relid, column)
            .unwrap_or_else(|| errors::undefined_column(column, &self.table));
        // SAFETY: syscache lookup of an existing column.
        let type_oid = unsafe { pg_sys::get_atttype(self.relid, attnum) };
        let integer = [pg_sys::INT2OID, pg_sys::INT4OID, pg_sys::INT8OID, pg_sys::NUMERICOID].contains(&type_oid);
        if !integer {
            errors::datatype_mismatch(format!("{argument} \"{column}\" of {} is not an integer column", self.table));
        }
        let quoted = quote(column);
        if self.changes.contains(&quoted) {
            errors::invalid_argument(
                format!("changes must not set {argument} \"{column}\""),
                "pg_fence sets that column itself; leave it out of changes.",
            );
        }
        quoted
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    /// `UPDATE table AS t SET <changes>[, extra_set] WHERE <filter>[ AND extra_where] RETURNING returning`
    pub fn update_sql(&self, extra_set: &str, extra_where: &str, returning: &str) -> String {
        let table = &self.table;
        let columns = self.changes.join(", ");
        let values = self.changes.iter().map(|c| format!("c.{c}")).collect::<Vec<_>>().join(", ");
        let mut set = format!(
            "({columns}) = (SELECT {values} FROM pg_catalog.jsonb_populate_record(NULL::{table}, $1) c)"
        );
        if !extra_set.is_empty() {
            set = format!("{set}, {extra_set}");
        }
        format!("UPDATE {table} AS t SET {set} WHERE {} RETURNING {returning}", self.where_sql(extra_where))
    }

    /// `SELECT what FROM table AS t WHERE <filter>[ AND extra_where]`
    pub fn select_sql(&self, what: &str, extra_where: &str) -> String {
        format!("SELECT {what} FROM {} AS t WHERE {}", self.table, self.where_sql(extra_where))
    }

    /// The filter columns equal their values: one row comparison against one sub-select, which the
    /// planner turns into plain `column = $param` conditions, so index scans stay possible.
    fn where_sql(&self, extra: &str) -> String {
        let table = &self.table;
        let columns = self.filter.iter().map(|c| format!("t.{c}")).collect::<Vec<_>>().join(", ");
        let values = self.filter.iter().map(|c| format!("f.{c}")).collect::<Vec<_>>().join(", ");
        let mut condition = format!(
            "({columns}) = (SELECT {values} FROM pg_catalog.jsonb_populate_record(NULL::{table}, $2) f)"
        );
        if !extra.is_empty() {
            condition = format!("{condition} AND {extra}");
        }
        condition
    }
}

#[derive(PartialEq)]
enum Nulls {
    Allowed,
    Refused,
}

fn table_name(function: &str, relid: pg_sys::Oid) -> String {
    // SAFETY: syscache lookups; they return 0/NULL for an OID that names no relation.
    let (relkind, name, namespace) = unsafe {
        (pg_sys::get_rel_relkind(relid) as u8, pg_sys::get_rel_name(relid), pg_sys::get_rel_namespace(relid))
    };
    if name.is_null() {
        errors::undefined_table(relid);
    }
    // SAFETY: checked non-NULL above; namespace of an existing relation.
    let (name, schema) = unsafe {
        (
            CStr::from_ptr(name).to_string_lossy().into_owned(),
            CStr::from_ptr(pg_sys::get_namespace_name(namespace)).to_string_lossy().into_owned(),
        )
    };
    let qualified = format!("{}.{}", quote(&schema), quote(&name));
    if relkind != pg_sys::RELKIND_RELATION && relkind != pg_sys::RELKIND_PARTITIONED_TABLE {
        errors::wrong_object_type(format!("{function} needs a table, and {qualified} is not one"));
    }
    qualified
}

/// The object's keys as quoted column names, each checked to be a column of the table.
fn columns(relid: pg_sys::Oid, table: &str, argument: &str, object: Option<&JsonB>, nulls: Nulls) -> Vec<String> {
    let object = object.unwrap_or_else(|| errors::null_argument(argument));
    let Some(map) = object.0.as_object() else {
        errors::invalid_argument(
            format!("{argument} must be a JSON object of column names to values, not {}", object.0),
            "For example '{\"status\": \"paid\"}'.",
        );
    };
    if map.is_empty() {
        errors::invalid_argument(
            format!("{argument} must name at least one column"),
            "An empty filter would update every row of the table; name the row, e.g. '{\"id\": 42}'.",
        );
    }
    map.iter()
        .map(|(column, value)| {
            if attnum(relid, column).is_none() {
                errors::undefined_column(column, table);
            }
            if nulls == Nulls::Refused && value.is_null() {
                errors::invalid_argument(
                    format!("{argument} value for column \"{column}\" is null"),
                    "Filter values are compared with =, which never matches NULL.",
                );
            }
            quote(column)
        })
        .collect()
}

/// The column's number, or None when the table has no such (live, user) column.
fn attnum(relid: pg_sys::Oid, column: &str) -> Option<pg_sys::AttrNumber> {
    let name = CString::new(column).ok()?;
    // SAFETY: syscache lookup; InvalidAttrNumber (0) when absent or dropped.
    let attnum = unsafe { pg_sys::get_attnum(relid, name.as_ptr()) };
    (attnum > 0).then_some(attnum)
}

fn quote(identifier: &str) -> String {
    pgrx::spi::quote_identifier(identifier)
}
