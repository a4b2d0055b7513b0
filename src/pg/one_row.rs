//! The one row of a one-row table of schema fence (fence.lock_secret, fence.high_water), read
//! without a statement, in the latest committed state: no privileges are needed (the guard, which
//! runs with the caller's rights, reads the secret), and a REPEATABLE READ transaction sees what
//! has committed since its snapshot was taken.
use pgrx::pg_sys;

/// Hands the columns of `table`'s first row (values, and whether each is NULL) to `read`; None when
/// the table is empty. `read` must copy out what it needs: the row is freed after it returns.
pub fn latest<R>(table: pg_sys::Oid, read: impl FnOnce(&[pg_sys::Datum], &[bool]) -> R) -> Option<R> {
    // SAFETY: the relation stays open and locked for the scan, the snapshot is registered until it
    // ends, and the tuple is read before it ends; an error on the way aborts the transaction, which
    // releases all three.
    unsafe {
        let rel = pg_sys::table_open(table, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetLatestSnapshot());
        let scan =
            pg_sys::systable_beginscan(rel, pg_sys::InvalidOid, false, snapshot, 0, std::ptr::null_mut());
        let tuple = pg_sys::systable_getnext(scan);
        let result = (!tuple.is_null()).then(|| {
            let desc = (*rel).rd_att;
            let natts = (*desc).natts as usize;
            let mut values = vec![pg_sys::Datum::from(0); natts];
            let mut nulls = vec![true; natts];
            pg_sys::heap_deform_tuple(tuple, desc, values.as_mut_ptr(), nulls.as_mut_ptr());
            read(&values, &nulls)
        });
        pg_sys::systable_endscan(scan);
        pg_sys::UnregisterSnapshot(snapshot);
        pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        result
    }
}
