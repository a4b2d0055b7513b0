//! "UPDATE target SET <changes> WHERE <filter>" for the fenced and versioned writes, built from the
//! caller's jsonb. Column names are checked against the table (`table_facts`, which keeps what the
//! catalogs say about it) and always quoted. Values become what jsonb_to_record would make of them
//! with the columns' own types, exactly as PostgreSQL turns JSON into a row (only the named
//! columns: a NOT NULL domain on another column must not get in the way). Statements run with the
//! caller's privileges, so table grants and row-level security apply.
//!
//! A JSON string, number, boolean or null bound for a column of a scalar type (anything but an
//! array, a composite, json or jsonb, or a domain over one) is converted here, before the statement
//! runs, by the same steps jsonb_to_record takes (the value's text, then the type's input function
//! with the column's typmod), and passed as a parameter of the column's type. Every other value goes
//! through jsonb_to_record inside the statement. Converting up front spares the statement a
//! function scan per jsonb argument, and lets a filter compare `column = $n` directly.
//!
//! In every statement built here, $1 is `changes`, $2 is `filter` (both jsonb), $3 a bigint (the
//! fence or the expected version), and $4 onwards the converted values (`RowUpdate::arguments`).
//!
//! The statements run with the caller's search_path, so every name in them is schema-qualified,
//! operators included (`OPERATOR(pg_catalog.>)`, and for a filter column the equality operator of
//! its type's default operator class, as foreign keys use): a look-alike operator earlier on the
//! search_path must not decide which rows are written.
use crate::pg::errors;
use crate::pg::input;
use crate::writes::json_object::{JsonArg, Value};
use crate::writes::table_facts::{self, Column as Facts};
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use std::ffi::CString;
use std::rc::Rc;

/// The number of the first converted value's parameter.
const FIRST_VALUE: usize = 4;

pub struct RowUpdate {
    /// The table, schema-qualified and quoted.
    table: Rc<str>,
    relid: pg_sys::Oid,
    changes: Vec<Column>,
    filter: Vec<Column>,
    /// The converted values, in parameter order from $4: type, and datum (None for NULL).
    values: Vec<(pg_sys::Oid, Option<pg_sys::Datum>)>,
}

/// A column named by the caller, and where its value is.
struct Column {
    facts: Rc<Facts>,
    value: Source,
}

impl Column {
    fn via_record(&self) -> bool {
        matches!(self.value, Source::Record)
    }

    /// The column's name, quoted.
    fn name(&self) -> &str {
        &self.facts.name
    }
}

enum Source {
    /// `$n`, a value converted before the statement runs, of the column's type.
    Parameter(String),
    /// The column of jsonb_to_record's row, declared there with the column's type.
    Record,
}

impl RowUpdate {
    /// Checks the arguments every fenced or versioned write shares; `function` names the caller in
    /// error messages. Locks the table as the UPDATE will, so it cannot be renamed or dropped while
    /// the statement is built from its name.
    pub fn new(
        function: &str,
        target: Option<pg_sys::Oid>,
        changes: Option<&JsonArg>,
        filter: Option<&JsonArg>,
    ) -> Self {
        let relid = input::required(target, "target");
        let table = table_facts::table(function, relid);
        let changes = columns(relid, &table, "changes", changes, Nulls::Allowed);
        let filter = columns(relid, &table, "filter", filter, Nulls::Refused);
        let mut update =
            RowUpdate { table, relid, changes: Vec::new(), filter: Vec::new(), values: Vec::new() };
        // Converted only once every name is known good, in parameter order.
        update.changes = changes.into_iter().map(|c| update.column(c)).collect();
        update.filter = filter.into_iter().map(|c| update.column(c)).collect();
        update
    }

    /// The statement's arguments: `changes`, `filter` and `third` for $1 to $3, then the converted
    /// values. A jsonb argument that no column reads is passed as NULL, so that the plan does not
    /// depend on it.
    pub fn arguments<'a>(
        &self,
        changes: Option<&JsonArg>,
        filter: Option<&JsonArg>,
        third: Option<i64>,
    ) -> Vec<DatumWithOid<'a>> {
        let read = |columns: &[Column], json: Option<&JsonArg>| match json {
            Some(json) if columns.iter().any(Column::via_record) => json.parameter(),
            _ => DatumWithOid::null_oid(pg_sys::JSONBOID),
        };
        let fixed = [read(&self.changes, changes), read(&self.filter, filter), third.into()];
        let values = self.values.iter().map(|&(type_oid, datum)| match datum {
            // SAFETY: a datum of that type, made by its input function in the calling function's
            // memory context, which outlives the statement.
            Some(datum) => unsafe { DatumWithOid::new(datum, type_oid) },
            None => DatumWithOid::null_oid(type_oid),
        });
        fixed.into_iter().chain(values).collect()
    }

    /// Converts the value now when it can (see the module comment), or leaves it to jsonb_to_record.
    fn column(&mut self, (facts, value): Named) -> Column {
        // The scalar's text (None for JSON null); None for an array or object, which only
        // jsonb_to_record converts.
        let text = match value {
            Value::Null => Some(None),
            Value::Scalar(text) => Some(Some(text)),
            Value::Structured => None,
        };
        let value = match text {
            Some(text) if facts.by_input_function => {
                self.values.push((facts.type_oid, input_function_call(&facts, text)));
                // No cast: the parameter's declared type is the column's (spi_plans keys plans by
                // it), and a cast without the typmod would mean length 1 for char(n) and bit(n).
                Source::Parameter(format!("${}", FIRST_VALUE + self.values.len() - 1))
            }
            _ => Source::Record,
        };
        Column { facts, value }
    }

    /// A column named by the caller outside the jsonb (fence_column, version_column): it must exist
    /// and hold an integer, and it must not also be among the changes.
    pub fn counter_column(&self, argument: &str, column: Option<&str>) -> String {
        let column = input::required(column, argument);
        let facts = table_facts::column(self.relid, &self.table, column);
        if ![pg_sys::INT2OID, pg_sys::INT4OID, pg_sys::INT8OID].contains(&facts.type_oid) {
            errors::datatype_mismatch(format!(
                "{argument} \"{column}\" of {} is not an integer column",
                self.table
            ));
        }
        if self.changes.iter().any(|c| c.name() == facts.name) {
            errors::invalid_argument(
                format!("changes must not set {argument} \"{column}\""),
                "pg_fence sets that column itself; leave it out of changes.",
            );
        }
        facts.name.clone()
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    pub fn relid(&self) -> pg_sys::Oid {
        self.relid
    }

    /// `UPDATE table AS t SET <changes>[, extra_set] WHERE <filter>[ AND extra_where] RETURNING returning`
    pub fn update_sql(&self, extra_set: &str, extra_where: &str, returning: &str) -> String {
        let from_record: Vec<&Column> = self.changes.iter().filter(|c| c.via_record()).collect();
        let mut set: Vec<String> = Vec::new();
        if !from_record.is_empty() {
            let columns = names(&from_record, "");
            let values = names(&from_record, "c.");
            set.push(format!("({columns}) = (SELECT {values} FROM {})", record(&from_record, "$1", "c")));
        }
        set.extend(self.changes.iter().filter_map(|c| match &c.value {
            Source::Parameter(parameter) => Some(format!("{} = {parameter}", c.name())),
            Source::Record => None,
        }));
        if !extra_set.is_empty() {
            set.push(extra_set.to_string());
        }
        format!(
            "UPDATE {} AS t SET {} WHERE {} RETURNING {returning}",
            self.table,
            set.join(", "),
            self.where_sql(extra_where)
        )
    }

    /// `SELECT what FROM table AS t WHERE <filter>[ AND extra_where]`
    pub fn select_sql(&self, what: &str, extra_where: &str) -> String {
        format!("SELECT {what} FROM {} AS t WHERE {}", self.table, self.where_sql(extra_where))
    }

    /// Each filter column equals its value: a parameter, or a sub-select of jsonb_to_record's row
    /// that the planner runs once (an InitPlan). Either way `column = value` is an index condition.
    fn where_sql(&self, extra: &str) -> String {
        let from_record: Vec<&Column> = self.filter.iter().filter(|c| c.via_record()).collect();
        let record = record(&from_record, "$2", "f");
        let mut conditions: Vec<String> = self
            .filter
            .iter()
            .map(|c| match &c.value {
                Source::Parameter(parameter) => format!("t.{} {} {parameter}", c.name(), equals(c)),
                Source::Record => {
                    format!("t.{} {} (SELECT f.{} FROM {record})", c.name(), equals(c), c.name())
                }
            })
            .collect();
        if !extra.is_empty() {
            conditions.push(extra.to_string());
        }
        conditions.join(" AND ")
    }
}

fn names(columns: &[&Column], prefix: &str) -> String {
    columns.iter().map(|c| format!("{prefix}{}", c.name())).collect::<Vec<_>>().join(", ")
}

/// `pg_catalog.jsonb_to_record($n) AS alias("a" type, "b" type)`
fn record(columns: &[&Column], parameter: &str, alias: &str) -> String {
    let definitions = columns
        .iter()
        .filter_map(|c| match &c.value {
            Source::Record => Some(format!("{} {}", c.name(), c.facts.sql_type)),
            Source::Parameter(_) => None,
        })
        .collect::<Vec<_>>()
        .join(", ");
    format!("pg_catalog.jsonb_to_record({parameter}) AS {alias}({definitions})")
}

#[derive(PartialEq)]
enum Nulls {
    Allowed,
    Refused,
}

/// A key of the caller's object, as a column of the table, with its value.
type Named = (Rc<Facts>, Value);

/// The object's keys as columns of the table, each checked to exist (and for the filter, to have an
/// equality operator).
fn columns(
    relid: pg_sys::Oid,
    table: &str,
    argument: &str,
    object: Option<&JsonArg>,
    nulls: Nulls,
) -> Vec<Named> {
    let object = input::required(object, argument);
    let Some(entries) = object.object() else {
        errors::invalid_argument(
            format!("{argument} must be a JSON object of column names to values, not {}", object.text()),
            "For example '{\"status\": \"paid\"}'.",
        );
    };
    if entries.is_empty() {
        errors::invalid_argument(
            format!("{argument} must name at least one column"),
            "An empty filter would update every row of the table; name the row, e.g. '{\"id\": 42}'.",
        );
    }
    entries
        .into_iter()
        .map(|(column, value)| {
            let facts = table_facts::column(relid, table, &column);
            if nulls == Nulls::Refused && matches!(value, Value::Null) {
                errors::invalid_argument(
                    format!("{argument} value for column \"{column}\" is null"),
                    "Filter values are compared with =, which never matches NULL.",
                );
            }
            if nulls == Nulls::Refused && facts.equals.is_none() {
                errors::no_equality(&column);
            }
            (facts, value)
        })
        .collect()
}

/// A filter column's equality operator (`columns` checked that it has one).
fn equals(column: &Column) -> &str {
    column.facts.equals.as_deref().unwrap_or_default()
}

/// The type's input function applied to `text` with the column's typmod, as jsonb_to_record
/// applies it: SQL NULL stays NULL, except that a domain's input function sees it, to check NOT NULL.
fn input_function_call(facts: &Facts, text: Option<CString>) -> Option<pg_sys::Datum> {
    if text.is_none() && !facts.is_domain {
        return None;
    }
    let pointer = text.as_ref().map_or(std::ptr::null_mut(), |t| t.as_ptr().cast_mut());
    // SAFETY: the input function gets a NUL-terminated string or NULL, and raises an ordinary SQL
    // error (22P02, 22001, 23502, ...) for a value that is not of the type.
    let datum = unsafe {
        pg_sys::OidInputFunctionCall(facts.input_function, pointer, facts.io_parameter, facts.typmod)
    };
    text.is_some().then_some(datum)
}
