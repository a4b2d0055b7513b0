//! Which version's SQL objects schema `fence` holds. Between installing a new library and running
//! ALTER EXTENSION pg_fence UPDATE, the library runs over the objects of an older version (the
//! server loads the new library for the old SQL functions); every call must keep working there,
//! with what those objects offer.
/// Whether the objects of version 0.4.0 are there: table fence.high_water, which its scripts create
/// together with fence.fence_not_above and fence.checked_version. One syscache lookup.
pub fn since_0_4_0() -> bool {
    crate::one_row::table(c"high_water").is_some()
}
