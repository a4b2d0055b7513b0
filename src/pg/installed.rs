//! Which version's SQL objects schema `fence` holds. Between installing a new library and running
//! ALTER EXTENSION pg_fence UPDATE, the library runs over the objects of an older version (the
//! server loads the new library for the old SQL functions); every call must keep working there,
//! with what those objects offer.
//!
//! Every lease call asks for several of these objects: their OIDs are kept per backend, and
//! forgotten whenever PostgreSQL announces a change to any relation's or type's name, or to any
//! schema (CREATE, DROP or ALTER EXTENSION among them). Announcements are read when syscache
//! look-ups would read them, so a kept OID is never older than a look-up's would be.
use pgrx::pg_sys;
use std::cell::{Cell, RefCell};
use std::ffi::CStr;

/// Each object kept, by the name it is kept under (None: not there).
type Kept = Vec<(&'static CStr, Option<pg_sys::Oid>)>;

thread_local! {
    /// What is kept, and the count of announced changes it was kept at.
    static KEPT: RefCell<(u64, Kept)> = const { RefCell::new((0, Vec::new())) };
    /// Changes announced so far: a count rather than a flag, so that a look-up made inside
    /// another's (since_0_5_0 looks up a table) cannot hide a change from the outer one.
    static CHANGES: Cell<u64> = const { Cell::new(0) };
    static CALLBACKS_REGISTERED: Cell<bool> = const { Cell::new(false) };
}

/// The table `name` of schema fence, if it is there.
pub fn table(name: &'static CStr) -> Option<pg_sys::Oid> {
    kept(name, || {
        // SAFETY: syscache look-ups by name; missing_ok, so a missing schema is InvalidOid.
        let table = unsafe {
            let namespace = pg_sys::get_namespace_oid(c"fence".as_ptr(), true);
            if namespace == pg_sys::InvalidOid {
                return None;
            }
            pg_sys::get_relname_relid(name.as_ptr(), namespace)
        };
        (table != pg_sys::InvalidOid).then_some(table)
    })
}

/// The composite type fence.lease, which lease_acquire returns.
pub fn lease_type() -> Option<pg_sys::Oid> {
    kept(c"type fence.lease", || pgrx::PgTupleDesc::for_composite_type("fence.lease").map(|desc| desc.oid()))
}

/// `look_up()`, kept under `name` until the next change announced. One announced while it looks
/// up leaves it unkept: this call alone uses it, as it would have without keeping.
fn kept(name: &'static CStr, look_up: impl FnOnce() -> Option<pg_sys::Oid>) -> Option<pg_sys::Oid> {
    register_callbacks();
    let changes = CHANGES.get();
    let found = KEPT.with_borrow_mut(|(kept_at, kept)| {
        if *kept_at != changes {
            kept.clear();
            *kept_at = changes;
        }
        kept.iter().find(|(each, _)| *each == name).map(|(_, oid)| *oid)
    });
    if let Some(oid) = found {
        return oid;
    }
    let oid = look_up();
    KEPT.with_borrow_mut(|(kept_at, kept)| {
        if CHANGES.get() == changes && *kept_at == changes {
            kept.push((name, oid));
        }
    });
    oid
}

fn register_callbacks() {
    if CALLBACKS_REGISTERED.replace(true) {
        return;
    }
    let catalogs = [
        pg_sys::SysCacheIdentifier::RELNAMENSP,
        pg_sys::SysCacheIdentifier::TYPENAMENSP,
        pg_sys::SysCacheIdentifier::NAMESPACENAME,
    ];
    super::catalog_changes::register(&catalogs, catalog_changed);
}

unsafe extern "C-unwind" fn catalog_changed(_arg: pg_sys::Datum, _catalog: std::ffi::c_int, _hash: u32) {
    CHANGES.set(CHANGES.get().wrapping_add(1));
}

/// Whether the objects of version 0.4.0 are there: table fence.high_water, which its scripts create
/// together with fence.fast_lease_state, fence.fence_not_above and fence.checked_version.
pub fn since_0_4_0() -> bool {
    table(c"high_water").is_some()
}

/// Whether the objects of version 0.5.0 are there: the lease tables' column `slot`, which its
/// scripts add together with `shared` and `permits` (src/leases/modes.rs).
pub fn since_0_5_0() -> bool {
    // ALTER TABLE .. ADD COLUMN changes the table's row of pg_class too, which forgets what is kept.
    let slot = kept(c"column fence.lease_state.slot", || {
        let table = table(c"lease_state")?;
        // SAFETY: a syscache look-up by name; a missing column is InvalidAttrNumber, not an error.
        let slot = unsafe { pg_sys::get_attnum(table, c"slot".as_ptr()) };
        (slot != pg_sys::InvalidAttrNumber as i16).then_some(table)
    });
    slot.is_some()
}
