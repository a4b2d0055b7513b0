//! Everything that differs between the PostgreSQL versions pg_fence is built and tested for (15, 17
//! and 18), in one place; the rest of the code calls these and never names a version.
//!
//! PostgreSQL 17 renamed a backend's slot in the proc array from BackendId to ProcNumber (with
//! VirtualTransactionId.procNumber and ProcNumberGetProc), and gave LockHeldByMe a third argument.
use pgrx::pg_sys;

#[cfg(not(any(feature = "pg15", feature = "pg17", feature = "pg18")))]
compile_error!("pg_fence is built for PostgreSQL 15, 17 or 18: pass --features pg15, pg17 or pg18");

/// A backend's slot in the proc array.
#[cfg(feature = "pg15")]
pub type ProcSlot = pg_sys::BackendId;
#[cfg(any(feature = "pg17", feature = "pg18"))]
pub type ProcSlot = pg_sys::ProcNumber;

/// Whether this backend holds the lock `tag` in exactly `mode`.
///
/// SAFETY: reads this backend's own lock table; call it in a backend.
pub unsafe fn lock_held_by_me(tag: &pg_sys::LOCKTAG, mode: pg_sys::LOCKMODE) -> bool {
    #[cfg(feature = "pg15")]
    return pg_sys::LockHeldByMe(tag, mode);
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    return pg_sys::LockHeldByMe(tag, mode, false);
}

/// The slot of the backend running a virtual transaction; None for a prepared transaction's.
pub fn holder_slot(vxid: &pg_sys::VirtualTransactionId) -> Option<ProcSlot> {
    #[cfg(feature = "pg15")]
    let (slot, invalid) = (vxid.backendId, pg_sys::InvalidBackendId);
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    let (slot, invalid) = (vxid.procNumber, pg_sys::INVALID_PROC_NUMBER);
    (slot != invalid).then_some(slot)
}

#[cfg(feature = "pg15")]
unsafe extern "C-unwind" {
    /// In PostgreSQL 15 (storage/sinvaladt.h), though pgrx does not bind it. It raises no errors
    /// (an array lookup under a shared LWLock), so it needs no pg_guard.
    fn BackendIdGetProc(backend_id: std::ffi::c_int) -> *mut pg_sys::PGPROC;
}

/// The PGPROC of the backend in `slot`; null when the slot is empty.
///
/// SAFETY: call it in a backend; the PGPROC may belong to another backend by the time it is used,
/// which is harmless for setting its latch (the only use).
pub unsafe fn proc_of(slot: ProcSlot) -> *mut pg_sys::PGPROC {
    #[cfg(feature = "pg15")]
    return BackendIdGetProc(slot);
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    return pg_sys::ProcNumberGetProc(slot);
}

/// Attribute `i` (from 0) of a tuple descriptor. PostgreSQL 18 keeps the attributes after an array
/// of compact ones and reads them through TupleDescAttr.
///
/// SAFETY: `desc` must be a valid tuple descriptor with more than `i` attributes.
pub unsafe fn attribute<'a>(desc: pg_sys::TupleDesc, i: usize) -> &'a pg_sys::FormData_pg_attribute {
    #[cfg(any(feature = "pg15", feature = "pg17"))]
    return &(*desc).attrs.as_slice((*desc).natts as usize)[i];
    #[cfg(feature = "pg18")]
    return &*pg_sys::TupleDescAttr(desc, i as std::ffi::c_int);
}

/// The OID of the relation's primary key index (InvalidOid if it has none).
///
/// SAFETY: `rel` must be an open relation.
pub unsafe fn primary_key_index(rel: pg_sys::Relation) -> pg_sys::Oid {
    #[cfg(any(feature = "pg15", feature = "pg17"))]
    return pg_sys::RelationGetPrimaryKeyIndex(rel);
    // 18 added "deferrable_ok"; the lease table's key is not deferrable either way.
    #[cfg(feature = "pg18")]
    return pg_sys::RelationGetPrimaryKeyIndex(rel, false);
}
