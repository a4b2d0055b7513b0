//! Which version's SQL objects schema `fence` holds. Between installing a new library and running
//! ALTER EXTENSION pg_fence UPDATE, the library runs over the objects of an older version (the
//! server loads the new library for the old SQL functions); every call must keep working there,
//! with what those objects offer.
use pgrx::pg_sys;

/// Whether the objects of version 0.4.0 are there: table fence.high_water, which its scripts create
/// together with fence.fence_not_above and fence.checked_version. One syscache lookup.
pub fn since_0_4_0() -> bool {
    // SAFETY: catalog lookups by name; a missing schema gives InvalidOid (missing_ok).
    unsafe {
        let namespace = pg_sys::get_namespace_oid(c"fence".as_ptr(), true);
        namespace != pg_sys::InvalidOid
            && pg_sys::get_relname_relid(c"high_water".as_ptr(), namespace) != pg_sys::InvalidOid
    }
}
