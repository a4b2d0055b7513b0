//! What the fenced and versioned writes need to know about a target table from the catalogs: its
//! schema-qualified name, and for each column named, its type and how a JSON value becomes one.
//!
//! Each backend keeps what it looked up: the look-ups are a large part of fenced_update's own time
//! (docs/benchmarks.md). PostgreSQL tells every backend of a catalog change by an invalidation message;
//! any message about a relation, schema, type, operator or operator class drops the whole cache
//! (the changes that could alter a name, a column or an equality operator), as PostgreSQL's own plan
//! cache does. `table` locks the table and then applies the messages that have arrived, before it
//! reads the cache: a name read from the cache is never one that changed since, which could by then
//! name another table.
use crate::pg::errors;
use pgrx::pg_sys;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::rc::Rc;

/// A column of the table, as a fenced write uses it.
pub struct Column {
    /// The column's name, quoted.
    pub name: String,
    pub type_oid: pg_sys::Oid,
    pub typmod: i32,
    /// The type as SQL, schema-qualified whatever the search_path, with its typmod.
    pub sql_type: String,
    /// Whether a JSON scalar becomes a value of the type through the type's input function.
    pub by_input_function: bool,
    /// A domain, whose input function must see a NULL too (to check NOT NULL).
    pub is_domain: bool,
    /// The type's input function, and the second argument it takes.
    pub input_function: pg_sys::Oid,
    pub io_parameter: pg_sys::Oid,
    /// `OPERATOR(schema.name)` of the type's equality operator; None when it has none.
    pub equals: Option<String>,
}

#[derive(Default)]
struct Cache {
    /// Quoted, schema-qualified names of tables, by OID.
    tables: HashMap<pg_sys::Oid, Rc<str>>,
    /// Columns by table OID and name.
    columns: HashMap<pg_sys::Oid, HashMap<String, Rc<Column>>>,
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::default();
    /// Set by the invalidation callbacks, which must not touch CACHE: they may run while it is read.
    static STALE: Cell<bool> = const { Cell::new(false) };
    static CALLBACKS_REGISTERED: Cell<bool> = const { Cell::new(false) };
}

/// The table's name, schema-qualified and quoted, after locking it as an UPDATE does (so it can be
/// neither renamed nor dropped until the transaction ends). Errors unless `relid` is a table;
/// `function` names the caller in the message.
pub fn table(function: &str, relid: pg_sys::Oid) -> Rc<str> {
    // Refused before anything is locked: a view or a sequence must not wait for a lock.
    require_table(function, relid);
    // SAFETY: the lock the UPDATE would take anyway. Taking a lock applies pending invalidations only
    // when the transaction did not hold it yet; with it held, a schema or type may still have been
    // renamed since (that takes no lock on the table), so they are applied here in any case.
    unsafe {
        pg_sys::LockRelationOid(relid, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE);
        pg_sys::AcceptInvalidationMessages();
    }
    if let Some(name) = cached(|cache| cache.tables.get(&relid).cloned()) {
        return name;
    }
    // The table may have been dropped before the lock.
    let name: Rc<str> = qualified_name(relid).unwrap_or_else(|| errors::undefined_table(relid)).into();
    remember(|cache| cache.tables.insert(relid, name.clone()));
    name
}

/// The table's column `column`, or an error naming `table` when it has none. Call after `table`.
pub fn column(relid: pg_sys::Oid, table: &str, column: &str) -> Rc<Column> {
    let found = cached(|cache| cache.columns.get(&relid).and_then(|columns| columns.get(column)).cloned());
    if let Some(found) = found {
        return found;
    }
    let attnum = attnum(relid, column).unwrap_or_else(|| errors::undefined_column(column, table));
    let (type_oid, typmod) = column_type(relid, attnum);
    let (mut input_function, mut io_parameter) = (pg_sys::InvalidOid, pg_sys::InvalidOid);
    // SAFETY: syscache lookups of the column's existing type.
    let is_domain = unsafe {
        pg_sys::getTypeInputInfo(type_oid, &mut input_function, &mut io_parameter);
        pg_sys::get_typtype(type_oid) == pg_sys::TYPTYPE_DOMAIN as std::ffi::c_char
    };
    let found = Rc::new(Column {
        name: quote(column),
        type_oid,
        typmod,
        sql_type: format_type(type_oid, typmod),
        by_input_function: converted_by_input_function(type_oid),
        is_domain,
        input_function,
        io_parameter,
        equals: equality_operator(type_oid),
    });
    remember(|cache| cache.columns.entry(relid).or_default().insert(column.to_owned(), found.clone()));
    found
}

/// Reads the cache, dropping it first if an invalidation came. The borrow ends before anything
/// else runs: a catalog look-up may apply invalidations.
fn cached<T>(read: impl FnOnce(&Cache) -> Option<T>) -> Option<T> {
    register_callbacks();
    CACHE.with_borrow_mut(|cache| {
        if STALE.replace(false) {
            *cache = Cache::default();
        }
        read(cache)
    })
}

/// Adds what was just looked up. If an invalidation came meanwhile, STALE is set and the next
/// `cached` drops it again: this call alone uses it, as it would have without a cache.
fn remember<T>(add: impl FnOnce(&mut Cache) -> T) {
    CACHE.with_borrow_mut(|cache| {
        add(cache);
    });
}

/// Registers the invalidation callbacks, once per backend. (PostgreSQL 15 has room for 10 relcache
/// callbacks per backend, and ends the session if more are registered: pg_fence takes one.)
fn register_callbacks() {
    if CALLBACKS_REGISTERED.replace(true) {
        return;
    }
    let catalogs = [
        pg_sys::SysCacheIdentifier::NAMESPACEOID,
        pg_sys::SysCacheIdentifier::TYPEOID,
        pg_sys::SysCacheIdentifier::OPEROID,
        pg_sys::SysCacheIdentifier::CLAOID,
    ];
    crate::pg::catalog_changes::register(&catalogs, catalog_changed);
    // SAFETY: a callback for the life of the backend, which only sets a flag.
    unsafe { pg_sys::CacheRegisterRelcacheCallback(Some(relation_changed), 0.into()) };
}

unsafe extern "C-unwind" fn relation_changed(_arg: pg_sys::Datum, _relid: pg_sys::Oid) {
    STALE.set(true);
}

unsafe extern "C-unwind" fn catalog_changed(_arg: pg_sys::Datum, _catalog: std::ffi::c_int, _hash: u32) {
    STALE.set(true);
}

/// Errors unless `relid` names a table.
fn require_table(function: &str, relid: pg_sys::Oid) {
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
}

/// The relation's name, schema-qualified and quoted; None when the OID names no relation.
pub fn qualified_name(relid: pg_sys::Oid) -> Option<String> {
    // SAFETY: syscache lookups, checked for NULL.
    unsafe {
        let name = pg_sys::get_rel_name(relid);
        let schema = if name.is_null() {
            std::ptr::null_mut()
        } else {
            pg_sys::get_namespace_name(pg_sys::get_rel_namespace(relid))
        };
        if name.is_null() || schema.is_null() {
            return None;
        }
        Some(format!("{}.{}", quote(&cstr(schema)), quote(&cstr(name))))
    }
}

/// The column's type and typmod.
fn column_type(relid: pg_sys::Oid, attnum: pg_sys::AttrNumber) -> (pg_sys::Oid, i32) {
    let (mut type_oid, mut typmod, mut collation) = (pg_sys::InvalidOid, -1, pg_sys::InvalidOid);
    // SAFETY: syscache lookup of an existing column.
    unsafe { pg_sys::get_atttypetypmodcoll(relid, attnum, &mut type_oid, &mut typmod, &mut collation) };
    (type_oid, typmod)
}

fn format_type(type_oid: pg_sys::Oid, typmod: i32) -> String {
    let flags = pg_sys::FORMAT_TYPE_TYPEMOD_GIVEN | pg_sys::FORMAT_TYPE_FORCE_QUALIFY;
    // SAFETY: format_type_extended returns a palloc'd string (or "???" for an unknown type).
    unsafe { cstr(pg_sys::format_type_extended(type_oid, typmod, flags as u16)) }
}

/// Whether jsonb_to_record converts a JSON scalar into this type with the type's input function:
/// every type but arrays, composites, json and jsonb (which it builds from JSON structure, or
/// keeps as JSON), and domains over those. (A domain's input function checks its constraints,
/// as jsonb_to_record does.)
fn converted_by_input_function(type_oid: pg_sys::Oid) -> bool {
    // SAFETY: type cache and syscache lookups.
    unsafe {
        let base = pg_sys::getBaseType(type_oid);
        base != pg_sys::JSONOID
            && base != pg_sys::JSONBOID
            && !pg_sys::type_is_rowtype(base)
            && pg_sys::get_element_type(base) == pg_sys::InvalidOid
    }
}

/// `OPERATOR(schema.name)` of the equality operator of the type's default btree or hash operator
/// class: the operator PostgreSQL itself means by "equal" for the type (as foreign keys use).
fn equality_operator(type_oid: pg_sys::Oid) -> Option<String> {
    // SAFETY: the type cache and the syscache are PostgreSQL's own caches; the operator tuple is
    // read (GETSTRUCT) and released before anything else happens.
    unsafe {
        let entry = pg_sys::lookup_type_cache(type_oid, pg_sys::TYPECACHE_EQ_OPR as i32);
        let operator = (*entry).eq_opr;
        if operator == pg_sys::InvalidOid {
            return None;
        }
        let tuple = pg_sys::SearchSysCache1(pg_sys::SysCacheIdentifier::OPEROID as i32, operator.into());
        if tuple.is_null() {
            return None;
        }
        let header = (*tuple).t_data;
        let form =
            &*(header.cast::<u8>().add((*header).t_hoff as usize) as *const pg_sys::FormData_pg_operator);
        let name = cstr(form.oprname.data.as_ptr());
        let schema = cstr(pg_sys::get_namespace_name(form.oprnamespace));
        pg_sys::ReleaseSysCache(tuple);
        Some(format!("OPERATOR({}.{name})", quote(&schema)))
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

pub fn quote(identifier: &str) -> String {
    pgrx::spi::quote_identifier(identifier)
}
