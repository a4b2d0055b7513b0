//! The committed fast leases, in shared memory (laid out as `layout` says): reading a key's rows,
//! walking every row, and applying a committed transaction's changes. Only `write_set` changes
//! rows, when a transaction commits, each new row taking a row reserved for it (`charges`).
use super::charges::uncharge;
use super::layout::{cell_key, each_cell, is_of, position, table, with_lock, Cell, Table, NONE};
pub use super::layout::{init, Place};
use super::row::Row;
use pgrx::pg_sys;
use std::sync::atomic::Ordering;

/// Every committed row of `key`, one per slot.
pub fn rows(place: Place, key: &str) -> Vec<Row> {
    let Some(table) = table() else { return Vec::new() };
    let bucket = table.bucket(place);
    with_lock(table.lock_of(bucket), pg_sys::LWLockMode::LW_SHARED, || {
        let mut rows = Vec::new();
        let mut at = table.buckets[bucket].load(Ordering::Relaxed);
        while at != NONE {
            // SAFETY: a cell of this bucket's chain, read under its lock.
            let cell = unsafe { &*table.cell(at) };
            if is_of(cell, place, key) {
                rows.push(cell.row);
            }
            at = cell.next.load(Ordering::Relaxed);
        }
        rows
    })
}

/// Calls `f` with the key and row of every row in this database chained from the `count` buckets
/// from `from` on (each bucket read under its lock); returns where to go on, 0 after the last.
pub fn each_row(from: usize, count: usize, mut f: impl FnMut(&str, &Row)) -> usize {
    // SAFETY: set for the life of a backend connected to a database.
    let here = unsafe { pg_sys::MyDatabaseId }.to_u32();
    each_row_of_every_database(from, count, |database, key, row| {
        if database == here {
            f(key, row);
        }
    })
}

/// `each_row` over the rows of every database, with each row's database.
pub fn each_row_of_every_database(from: usize, count: usize, mut f: impl FnMut(u32, &str, &Row)) -> usize {
    each_cell(from, count, |cell| f(cell.database, cell_key(cell), &cell.row))
}

/// The (key, row) of up to `limit` rows of this database charged to `role` (any role: None) for
/// which `wanted` holds, each read under its bucket's lock.
pub fn rows_charged(
    role: Option<u32>,
    limit: usize,
    mut wanted: impl FnMut(&str, &Row) -> bool,
) -> Vec<(String, Row)> {
    // SAFETY: set for the life of a backend connected to a database.
    let here = unsafe { pg_sys::MyDatabaseId }.to_u32();
    let mut found = Vec::new();
    let mut at = 0;
    loop {
        at = each_cell(at, 1024, |cell| {
            let key = cell_key(cell);
            if cell.database == here && role.is_none_or(|role| role == cell.role) && wanted(key, &cell.row) {
                found.push((key.to_owned(), cell.row));
            }
        });
        if at == 0 || found.len() >= limit {
            found.truncate(limit);
            return found;
        }
    }
}

/// Sets `key`'s row of `row.slot` to `row`, or deletes the row of `slot` when `row` is None. A new
/// row takes a reserved one (`reserved`: the role whose reservation the change holds, given back
/// if unused). Never fails: this runs in the commit.
pub fn apply(place: Place, key: &str, slot: i32, row: Option<&Row>, reserved: Option<u32>) {
    let Some(table) = table() else { return };
    let bucket = table.bucket(place);
    let mut freed = NONE;
    let mut used_reservation = false;
    with_lock(table.lock_of(bucket), pg_sys::LWLockMode::LW_EXCLUSIVE, || {
        let head = &table.buckets[bucket];
        let (previous, at) = position(&table, bucket, place, key, slot);
        match (row, at) {
            (Some(row), NONE) => {
                let Some(new) = take_free(&table) else { return };
                used_reservation = true;
                // SAFETY: a free cell, now this chain's, under its lock.
                let cell = unsafe { &mut *table.cell(new) };
                cell.database = place.database;
                cell.role = reserved.unwrap_or(0);
                cell.hash = place.hash;
                cell.key_len = key.len() as u16;
                cell.key[..key.len()].copy_from_slice(key.as_bytes());
                cell.row = *row;
                cell.next.store(head.load(Ordering::Relaxed), Ordering::Relaxed);
                head.store(new, Ordering::Relaxed);
            }
            // SAFETY: the cell found above, under its lock.
            (Some(row), found) => unsafe { (*table.cell(found)).row = *row },
            (None, NONE) => {}
            (None, found) => {
                // SAFETY: unlinking the cell found above from its chain, under its lock.
                let next = unsafe { (*table.cell(found)).next.load(Ordering::Relaxed) };
                if previous == NONE {
                    head.store(next, Ordering::Relaxed);
                } else {
                    // SAFETY: as above.
                    unsafe { (*table.cell(previous)).next.store(next, Ordering::Relaxed) };
                }
                freed = found;
            }
        }
    });
    if freed != NONE {
        give_free(&table, freed);
    }
    if let Some(role) = reserved {
        with_lock(table.free_list_lock(), pg_sys::LWLockMode::LW_EXCLUSIVE, || {
            if !used_reservation {
                uncharge(table.header, role);
            }
            table.header.reserved.fetch_sub(1, Ordering::AcqRel);
        });
    }
    table.header.changes.fetch_add(1, Ordering::Relaxed);
}

fn take_free(table: &Table) -> Option<u32> {
    with_lock(table.free_list_lock(), pg_sys::LWLockMode::LW_EXCLUSIVE, || {
        let header = table.header;
        let head = header.free.load(Ordering::Relaxed);
        let taken = if head != NONE {
            // SAFETY: the free list's head, under its lock.
            let next = unsafe { (*table.cell(head)).next.load(Ordering::Relaxed) };
            header.free.store(next, Ordering::Relaxed);
            head
        } else {
            let never_used = header.never_used.load(Ordering::Relaxed);
            if never_used >= header.capacity {
                return None;
            }
            header.never_used.store(never_used + 1, Ordering::Relaxed);
            never_used
        };
        header.used.fetch_add(1, Ordering::AcqRel);
        Some(taken)
    })
}

fn give_free(table: &Table, index: u32) {
    with_lock(table.free_list_lock(), pg_sys::LWLockMode::LW_EXCLUSIVE, || {
        // SAFETY: a cell unlinked from every chain: nobody else reads or writes it.
        uncharge(table.header, unsafe { (*table.cell(index)).role });
        // SAFETY: a cell unlinked from every chain, now the free list's, under its lock.
        unsafe {
            (*table.cell(index)).next.store(table.header.free.load(Ordering::Relaxed), Ordering::Relaxed)
        };
        table.header.free.store(index, Ordering::Relaxed);
        table.header.used.fetch_sub(1, Ordering::AcqRel);
    });
}

/// Deletes the committed row of `key`'s `slot` at once, outside any transaction, having raised the
/// floor of freed rows to its fence first: for a grant that needs room (see `changes`), which holds
/// the key's lock, so that no transaction has a change of it pending.
pub fn free_now(place: Place, key: &str, slot: i32, fence: i64) {
    let Some(table) = table() else { return };
    table.header.freed.fetch_max(fence, Ordering::AcqRel);
    apply(place, key, slot, None, None);
}

/// The highest fence of a row freed by `free_now`; None when none was.
pub fn freed_floor() -> Option<i64> {
    let freed = table()?.header.freed.load(Ordering::Acquire);
    (freed != 0).then_some(freed)
}

/// This shared memory's generation (see `Header::generation`); None without preload.
pub fn generation() -> Option<u64> {
    table().map(|table| table.header.generation)
}

/// Whether database `oid` exists (pg_database is shared: any backend can look).
pub fn database_exists(oid: u32) -> bool {
    // SAFETY: a syscache lookup of a shared catalog, in a backend with a transaction.
    !unsafe { pg_sys::get_database_name(pg_sys::Oid::from(oid)) }.is_null()
}

/// Deletes `key`'s row of `slot` in `database` at once, outside any transaction: for the rows of a
/// dropped database, which no backend can be connected to.
pub fn delete_of_dropped_database(database: u32, key: &str, slot: i32) {
    if let Some(place) = Place::in_database(database, key) {
        apply(place, key, slot, None, None);
    }
}

/// (rows in use, rows reserved by transactions not yet ended, capacity).
pub fn occupancy() -> (u32, u32, u32) {
    table().map_or((0, 0, 0), |table| {
        let header = table.header;
        (header.used.load(Ordering::Relaxed), header.reserved.load(Ordering::Relaxed), header.capacity)
    })
}

/// (rows in use, capacity, bytes per row), for fence.stats and the docs; None without preload.
pub fn usage() -> Option<(u32, u32, usize)> {
    let table = table()?;
    Some((table.header.used.load(Ordering::Relaxed), table.header.capacity, std::mem::size_of::<Cell>()))
}
