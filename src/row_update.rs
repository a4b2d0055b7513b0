//! "UPDATE target SET <changes> WHERE <filter>" for the fenced and versioned writes, built from the
//! caller's jsonb. Column names are checked against the table and always quoted; values are converted
//! by jsonb_to_record with the columns' own types, exactly as PostgreSQL turns JSON into a row (only
//! the named columns: a NOT NULL domain on another column must not get in the way). Statements run
//! with the caller's privileges, so table grants and row-level security apply.
//!
//! In every statement built here, $1 is `changes`, $2 is `filter` (both jsonb) and $3 a bigint
//! (the fence or the expected version).
//!
//! The statements run with the caller's search_path, so every name in them is schema-qualified,
//! operators included (`OPERATOR(pg_catalog.>)`, and for a filter column the equality operator of
//! its type's default operator class, as foreign keys use): a look-alike operator earlier on the
//! search_path must not decide which rows are written.
use crate::{errors, input};
use pgrx::pg_sys;
use pgrx::JsonB;
use std::ffi::{CStr, CString};

pub struct RowUpdate {
    /// The table, schema-qualified and quoted.
    table: String,
    relid: pg_sys::Oid,
    changes: Vec<Column>,
    filter: Vec<Column>,
}

/// A column named by the caller: its quoted name, its type (schema-qualified, with typmod), and for
/// a filter column its type's equality operator, as `OPERATOR(schema.=)`.
struct Column {
    name: String,
    sql_type: String,
    equals: String,
}

impl RowUpdate {
    /// Checks the arguments every fenced or versioned write shares; `function` names the caller in
    /// error messages. Locks the table as the UPDATE will, so it cannot be renamed or dropped while
    /// the statement is built from its name.
    pub fn new(
        function: &str,
        target: Option<pg_sys::Oid>,
        changes: Option<&JsonB>,
        filter: Option<&JsonB>,
    ) -> Self {
        let relid = input::required(target, "target");
        let table = table_name(function, relid);
        let changes = columns(relid, &table, "changes", changes, Nulls::Allowed);
        let filter = columns(relid, &table, "filter", filter, Nulls::Refused);
        RowUpdate { table, relid, changes, filter }
    }

    /// A column named by the caller outside the jsonb (fence_column, version_column): it must exist
    /// and hold an integer, and it must not also be among the changes.
    pub fn counter_column(&self, argument: &str, column: Option<&str>) -> String {
        let column = input::required(column, argument);
        let attnum =
            attnum(self.relid, column).unwrap_or_else(|| errors::undefined_column(column, &self.table));
        // SAFETY: syscache lookup of an existing column.
        let type_oid = unsafe { pg_sys::get_atttype(self.relid, attnum) };
        if ![pg_sys::INT2OID, pg_sys::INT4OID, pg_sys::INT8OID].contains(&type_oid) {
            errors::datatype_mismatch(format!(
                "{argument} \"{column}\" of {} is not an integer column",
                self.table
            ));
        }
        let quoted = quote(column);
        if self.changes.iter().any(|c| c.name == quoted) {
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
        let columns = names(&self.changes, "");
        let values = names(&self.changes, "c.");
        let mut set = format!("({columns}) = (SELECT {values} FROM {})", record(&self.changes, "$1", "c"));
        if !extra_set.is_empty() {
            set = format!("{set}, {extra_set}");
        }
        format!(
            "UPDATE {} AS t SET {set} WHERE {} RETURNING {returning}",
            self.table,
            self.where_sql(extra_where)
        )
    }

    /// `SELECT what FROM table AS t WHERE <filter>[ AND extra_where]`
    pub fn select_sql(&self, what: &str, extra_where: &str) -> String {
        format!("SELECT {what} FROM {} AS t WHERE {}", self.table, self.where_sql(extra_where))
    }

    /// Each filter column equals its value, taken from a sub-select the planner runs once (an
    /// InitPlan), so `column = value` stays an index condition.
    fn where_sql(&self, extra: &str) -> String {
        let record = record(&self.filter, "$2", "f");
        let mut conditions: Vec<String> = self
            .filter
            .iter()
            .map(|c| format!("t.{} {} (SELECT f.{} FROM {record})", c.name, c.equals, c.name))
            .collect();
        if !extra.is_empty() {
            conditions.push(extra.to_string());
        }
        conditions.join(" AND ")
    }
}

fn names(columns: &[Column], prefix: &str) -> String {
    columns.iter().map(|c| format!("{prefix}{}", c.name)).collect::<Vec<_>>().join(", ")
}

/// `pg_catalog.jsonb_to_record($n) AS alias("a" type, "b" type)`
fn record(columns: &[Column], parameter: &str, alias: &str) -> String {
    let definitions =
        columns.iter().map(|c| format!("{} {}", c.name, c.sql_type)).collect::<Vec<_>>().join(", ");
    format!("pg_catalog.jsonb_to_record({parameter}) AS {alias}({definitions})")
}

#[derive(PartialEq)]
enum Nulls {
    Allowed,
    Refused,
}

fn table_name(function: &str, relid: pg_sys::Oid) -> String {
    // SAFETY: syscache lookups; they return 0/NULL for an OID that names no relation.
    let relkind = unsafe { pg_sys::get_rel_relkind(relid) } as u8;
    if relkind == 0 {
        errors::undefined_table(relid);
    }
    if relkind != pg_sys::RELKIND_RELATION && relkind != pg_sys::RELKIND_PARTITIONED_TABLE {
        // SAFETY: an existing relation; NULL only if it vanished meanwhile.
        let name = unsafe { pg_sys::get_rel_name(relid) };
        let name = if name.is_null() { relid.to_u32().to_string() } else { unsafe { cstr(name) } };
        errors::wrong_object_type(format!("{function} needs a table, and \"{name}\" is not one"));
    }
    // SAFETY: the lock the UPDATE would take anyway; after it, the names cannot change under us.
    unsafe { pg_sys::LockRelationOid(relid, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE) };
    // SAFETY: syscache lookups, checked for NULL (the table may have been dropped before the lock).
    let (name, schema) = unsafe {
        let name = pg_sys::get_rel_name(relid);
        let schema = if name.is_null() {
            std::ptr::null_mut()
        } else {
            pg_sys::get_namespace_name(pg_sys::get_rel_namespace(relid))
        };
        if name.is_null() || schema.is_null() {
            errors::undefined_table(relid);
        }
        (cstr(name), cstr(schema))
    };
    format!("{}.{}", quote(&schema), quote(&name))
}

/// The object's keys as columns of the table, each checked to exist.
fn columns(
    relid: pg_sys::Oid,
    table: &str,
    argument: &str,
    object: Option<&JsonB>,
    nulls: Nulls,
) -> Vec<Column> {
    let object = input::required(object, argument);
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
            let attnum = attnum(relid, column).unwrap_or_else(|| errors::undefined_column(column, table));
            if nulls == Nulls::Refused && value.is_null() {
                errors::invalid_argument(
                    format!("{argument} value for column \"{column}\" is null"),
                    "Filter values are compared with =, which never matches NULL.",
                );
            }
            let (sql_type, type_oid) = column_type(relid, attnum);
            let equals =
                if nulls == Nulls::Refused { equality_operator(type_oid, column) } else { String::new() };
            Column { name: quote(column), sql_type, equals }
        })
        .collect()
}

/// The column's type as SQL, schema-qualified whatever the search_path, with its typmod; and its OID.
fn column_type(relid: pg_sys::Oid, attnum: pg_sys::AttrNumber) -> (String, pg_sys::Oid) {
    let (mut type_oid, mut typmod, mut collation) = (pg_sys::InvalidOid, -1, pg_sys::InvalidOid);
    // SAFETY: syscache lookups of an existing column; format_type returns a palloc'd string.
    unsafe {
        pg_sys::get_atttypetypmodcoll(relid, attnum, &mut type_oid, &mut typmod, &mut collation);
        let flags = pg_sys::FORMAT_TYPE_TYPEMOD_GIVEN | pg_sys::FORMAT_TYPE_FORCE_QUALIFY;
        (cstr(pg_sys::format_type_extended(type_oid, typmod, flags as u16)), type_oid)
    }
}

/// `OPERATOR(schema.name)` of the equality operator of the type's default btree or hash operator
/// class: the operator PostgreSQL itself means by "equal" for the type.
fn equality_operator(type_oid: pg_sys::Oid, column: &str) -> String {
    // SAFETY: the type cache and the syscache are PostgreSQL's own caches; the operator tuple is
    // read (GETSTRUCT) and released before anything else happens.
    unsafe {
        let entry = pg_sys::lookup_type_cache(type_oid, pg_sys::TYPECACHE_EQ_OPR as i32);
        let operator = (*entry).eq_opr;
        let tuple = pg_sys::SearchSysCache1(pg_sys::SysCacheIdentifier::OPEROID as i32, operator.into());
        if operator == pg_sys::InvalidOid || tuple.is_null() {
            errors::no_equality(column);
        }
        let header = (*tuple).t_data;
        let form =
            &*(header.cast::<u8>().add((*header).t_hoff as usize) as *const pg_sys::FormData_pg_operator);
        let name = cstr(form.oprname.data.as_ptr());
        let schema = cstr(pg_sys::get_namespace_name(form.oprnamespace));
        pg_sys::ReleaseSysCache(tuple);
        format!("OPERATOR({}.{name})", quote(&schema))
    }
}

/// The column's number, or None when the table has no such (live, user) column.
fn attnum(relid: pg_sys::Oid, column: &str) -> Option<pg_sys::AttrNumber> {
    let name = CString::new(column).ok()?;
    // SAFETY: syscache lookup; InvalidAttrNumber (0) when absent or dropped.
    let attnum = unsafe { pg_sys::get_attnum(relid, name.as_ptr()) };
    (attnum > 0).then_some(attnum)
}

/// SAFETY: `ptr` must be a valid NUL-terminated string.
unsafe fn cstr(ptr: *const std::ffi::c_char) -> String {
    CStr::from_ptr(ptr).to_string_lossy().into_owned()
}

fn quote(identifier: &str) -> String {
    pgrx::spi::quote_identifier(identifier)
}
