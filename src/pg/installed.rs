//! Which version's SQL objects schema `fence` holds. Between installing a new library and running
//! ALTER EXTENSION pg_fence UPDATE, the library runs over the objects of an older version (the
//! server loads the new library for the old SQL functions); every call must keep working there,
//! with what those objects offer.
use pgrx::pg_sys;

/// The table `name` of schema fence, if it is there.
pub fn table(name: &std::ffi::CStr) -> Option<pg_sys::Oid> {
    // SAFETY: syscache look-ups by name; missing_ok, so a missing schema is InvalidOid, not an error.
    let table = unsafe {
        let namespace = pg_sys::get_namespace_oid(c"fence".as_ptr(), true);
        if namespace == pg_sys::InvalidOid {
            return None;
        }
        pg_sys::get_relname_relid(name.as_ptr(), namespace)
    };
    (table != pg_sys::InvalidOid).then_some(table)
}

/// Whether the objects of version 0.4.0 are there: table fence.high_water, which its scripts create
/// together with fence.fast_lease_state, fence.fence_not_above and fence.checked_version.
pub fn since_0_4_0() -> bool {
    table(c"high_water").is_some()
}

/// Whether the objects of version 0.5.0 are there: the lease tables' column `slot`, which its
/// scripts add together with `shared` and `permits` (src/leases/modes.rs).
pub fn since_0_5_0() -> bool {
    let Some(table) = table(c"lease_state") else { return false };
    // SAFETY: a syscache look-up by name; a missing column is InvalidAttrNumber, not an error.
    unsafe { pg_sys::get_attnum(table, c"slot".as_ptr()) != pg_sys::InvalidAttrNumber as i16 }
}
