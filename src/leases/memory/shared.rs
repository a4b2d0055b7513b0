//! The committed fast leases, in shared memory: a fixed array of rows (pg_fence.fast_leases of
//! them), chained from a fixed array of buckets by a hash of (database, key), so that one walk
//! finds every slot of a key. Each bucket belongs to one of PARTITIONS LWLocks; the list of free
//! rows has a lock of its own. Only `write_set` changes rows, when a transaction commits.
//!
//! A transaction first reserves a row for each (key, slot) it is to add (`reserve`), when it makes
//! the change, so that applying its changes at commit cannot run out of rows: a full table refuses
//! the change then, with an error, and nothing is half made.
use super::row::Row;
use crate::pg::shmem::Region;
use pgrx::pg_sys;
use siphasher::sip::SipHasher13;
use std::hash::Hasher;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// How many LWLocks share the buckets: concurrent changes of different keys rarely meet.
pub const PARTITIONS: usize = 128;
/// No row: the end of a chain, or of the free list.
const NONE: u32 = u32::MAX;

#[repr(C)]
struct Header {
    capacity: u32,
    buckets: u32,
    /// Rows in use, and rows reserved by transactions not yet ended.
    used: AtomicU32,
    reserved: AtomicU32,
    /// The head of the list of freed rows, and the first row never used (under the free list's
    /// lock): rows are touched only once used, so a large table costs memory only as it fills.
    free: AtomicU32,
    never_used: AtomicU32,
    /// The keys of the hash, drawn when the table is made: chains nobody can aim at.
    secret: [u64; 2],
    /// Bumped at every change, for readers that cache nothing but want to know.
    changes: AtomicU64,
    /// The reset markers (see `fences`): database << 32 | incarnation, of each extension whose fast
    /// grants have begun since the table was made; 0 for none.
    markers: [AtomicU64; MARKERS],
}

/// How many databases' markers the table keeps; beyond that, a database looks for its marker in
/// vain, and each backend's first fast grant there starts above the fast reservation (always safe).
const MARKERS: usize = 256;

/// A row of the table: its key, where it chains, and the lease.
#[repr(C)]
struct Cell {
    next: AtomicU32,
    database: u32,
    hash: u64,
    key_len: u16,
    key: [u8; crate::pg::input::MAX_KEY_BYTES],
    row: Row,
}

static TABLE: Region = Region::with_locks(c"pg_fence fast leases", table_size, format, PARTITIONS + 1);

/// Called from _PG_init.
pub fn init() {
    TABLE.request();
}

fn capacity() -> usize {
    crate::pg::settings::fast_leases()
}

fn bucket_count(capacity: usize) -> usize {
    (capacity * 2).next_power_of_two().max(64)
}

fn layout(capacity: usize) -> (usize, usize, usize) {
    let buckets_at = std::mem::size_of::<Header>().next_multiple_of(64);
    let rows_at = (buckets_at + bucket_count(capacity) * 4).next_multiple_of(64);
    (buckets_at, rows_at, rows_at + capacity * std::mem::size_of::<Cell>())
}

fn table_size() -> usize {
    layout(capacity()).2
}

/// The table, once placed; None without preload.
struct Table {
    header: &'static Header,
    buckets: &'static [AtomicU32],
    cells: *mut Cell,
    locks: *mut pg_sys::LWLockPadded,
}

fn table() -> Option<Table> {
    let (base, _) = TABLE.bytes()?;
    let locks = TABLE.locks();
    // SAFETY: the region is `table_size()` bytes laid out by `layout`, set up by `format` when it
    // was placed (before any backend existed), and aligned (ShmemInitStruct aligns to the cache line).
    unsafe {
        let header = &*base.cast::<Header>();
        let (buckets_at, rows_at, _) = layout(header.capacity as usize);
        let buckets =
            std::slice::from_raw_parts(base.add(buckets_at).cast::<AtomicU32>(), header.buckets as usize);
        Some(Table { header, buckets, cells: base.add(rows_at).cast::<Cell>(), locks })
    }
}

/// Makes the region a table with every row free. Runs in the postmaster, alone.
fn format(base: *mut u8, len: usize) {
    // SAFETY: `base` is the region of `len` bytes, used by nobody yet.
    unsafe { format_table(base, len) }
}

/// Writes the header and the buckets only: a row's bytes are written when it is first used.
///
/// SAFETY: `base` must be the region of `len` bytes, used by nobody yet.
unsafe fn format_table(base: *mut u8, len: usize) {
    let capacity = capacity();
    assert!(layout(capacity).2 <= len, "pg_fence fast leases: the region is smaller than its layout");
    let (buckets_at, _, _) = layout(capacity);
    std::ptr::write_bytes(base, 0, buckets_at);
    let header = &mut *base.cast::<Header>();
    header.capacity = capacity as u32;
    header.buckets = bucket_count(capacity) as u32;
    header.secret = [rand_u64(), rand_u64()];
    let buckets =
        std::slice::from_raw_parts(base.add(buckets_at).cast::<AtomicU32>(), header.buckets as usize);
    buckets.iter().for_each(|bucket| bucket.store(NONE, Ordering::Relaxed));
    header.free.store(NONE, Ordering::Relaxed);
    header.never_used.store(0, Ordering::Relaxed);
}

fn rand_u64() -> u64 {
    let bytes = *uuid::Uuid::new_v4().as_bytes();
    u64::from_le_bytes(bytes[..8].try_into().unwrap_or_default())
}

/// Where a key's rows chain, in this cluster's table.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Place {
    pub database: u32,
    pub hash: u64,
}

impl Place {
    /// None without preload.
    pub fn of(key: &str) -> Option<Place> {
        let table = table()?;
        let [k0, k1] = table.header.secret;
        let mut hasher = SipHasher13::new_with_keys(k0, k1);
        // SAFETY: set for the life of a backend connected to a database.
        let database = unsafe { pg_sys::MyDatabaseId }.to_u32();
        hasher.write_u32(database);
        hasher.write(key.as_bytes());
        Some(Place { database, hash: hasher.finish() })
    }
}

impl Table {
    fn bucket(&self, place: Place) -> usize {
        (place.hash as usize) & (self.buckets.len() - 1)
    }

    fn lock_of(&self, bucket: usize) -> *mut pg_sys::LWLock {
        // SAFETY: PARTITIONS + 1 locks were asked for with the region.
        unsafe { &mut (*self.locks.add(bucket % PARTITIONS)).lock }
    }

    fn free_list_lock(&self) -> *mut pg_sys::LWLock {
        // SAFETY: as above; the last one.
        unsafe { &mut (*self.locks.add(PARTITIONS)).lock }
    }

    /// SAFETY: `index` must be below the capacity; the caller holds the lock that guards the cell.
    unsafe fn cell(&self, index: u32) -> *mut Cell {
        self.cells.add(index as usize)
    }
}

/// Runs `f` holding `lock` in `mode`. LWLocks are released by PostgreSQL at an error too.
fn with_lock<R>(lock: *mut pg_sys::LWLock, mode: pg_sys::LWLockMode::Type, f: impl FnOnce() -> R) -> R {
    // SAFETY: a lock of this region's tranche; held only around memory reads and writes.
    unsafe { pg_sys::LWLockAcquire(lock, mode) };
    let result = f();
    // SAFETY: as above.
    unsafe { pg_sys::LWLockRelease(lock) };
    result
}

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

fn is_of(cell: &Cell, place: Place, key: &str) -> bool {
    cell.hash == place.hash
        && cell.database == place.database
        && &cell.key[..cell.key_len as usize] == key.as_bytes()
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
    let Some(table) = table() else { return 0 };
    let end = from.saturating_add(count).min(table.buckets.len());
    for bucket in from..end {
        with_lock(table.lock_of(bucket), pg_sys::LWLockMode::LW_SHARED, || {
            let mut at = table.buckets[bucket].load(Ordering::Relaxed);
            while at != NONE {
                // SAFETY: a cell of this bucket's chain, read under its lock.
                let cell = unsafe { &*table.cell(at) };
                f(
                    cell.database,
                    std::str::from_utf8(&cell.key[..cell.key_len as usize]).unwrap_or_default(),
                    &cell.row,
                );
                at = cell.next.load(Ordering::Relaxed);
            }
        });
    }
    if end >= table.buckets.len() {
        0
    } else {
        end
    }
}

/// Whether the table has a row for `key`'s `slot`.
pub fn has_row(place: Place, key: &str, slot: i32) -> bool {
    rows(place, key).iter().any(|row| row.slot == slot)
}

/// Reserves a row for a change to be applied at commit; false when the table is full.
pub fn reserve() -> bool {
    let Some(table) = table() else { return false };
    let header = table.header;
    let reserved = header.reserved.fetch_add(1, Ordering::AcqRel) + 1;
    if header.used.load(Ordering::Acquire) + reserved > header.capacity {
        header.reserved.fetch_sub(1, Ordering::AcqRel);
        return false;
    }
    true
}

/// Gives back a reservation that no change used.
pub fn unreserve() {
    if let Some(table) = table() {
        table.header.reserved.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Sets `key`'s row of `row.slot` to `row`, or deletes the row of `slot` when `row` is None. A new
/// row takes a reserved one (`reserved`: whether the change reserved one, given back if unused).
/// Never fails: this runs in the commit.
pub fn apply(place: Place, key: &str, slot: i32, row: Option<&Row>, reserved: bool) {
    let Some(table) = table() else { return };
    let bucket = table.bucket(place);
    let mut freed = NONE;
    let mut used_reservation = false;
    with_lock(table.lock_of(bucket), pg_sys::LWLockMode::LW_EXCLUSIVE, || {
        let head = &table.buckets[bucket];
        let (mut previous, mut at) = (NONE, head.load(Ordering::Relaxed));
        while at != NONE {
            // SAFETY: a cell of this bucket's chain, under its lock.
            let cell = unsafe { &mut *table.cell(at) };
            if is_of(cell, place, key) && cell.row.slot == slot {
                break;
            }
            (previous, at) = (at, cell.next.load(Ordering::Relaxed));
        }
        match (row, at) {
            (Some(row), NONE) => {
                let Some(new) = take_free(&table) else { return };
                used_reservation = true;
                // SAFETY: a free cell, now this chain's, under its lock.
                let cell = unsafe { &mut *table.cell(new) };
                cell.database = place.database;
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
    if reserved {
        table.header.reserved.fetch_sub(1, Ordering::AcqRel);
    }
    let _ = used_reservation;
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
        // SAFETY: a cell unlinked from every chain, now the free list's, under its lock.
        unsafe {
            (*table.cell(index)).next.store(table.header.free.load(Ordering::Relaxed), Ordering::Relaxed)
        };
        table.header.free.store(index, Ordering::Relaxed);
        table.header.used.fetch_sub(1, Ordering::AcqRel);
    });
}

/// Whether the reset marker of (database, incarnation) is there.
pub fn marker_is_there(database: u32, incarnation: u32) -> bool {
    let Some(table) = table() else { return false };
    let marker = u64::from(database) << 32 | u64::from(incarnation);
    table.header.markers.iter().any(|each| each.load(Ordering::Acquire) == marker)
}

/// Places the reset marker of (database, incarnation), over an older one of the database.
pub fn place_marker(database: u32, incarnation: u32) {
    let Some(table) = table() else { return };
    let marker = u64::from(database) << 32 | u64::from(incarnation);
    let markers = &table.header.markers;
    // Markers of databases dropped since are cleared first (a look at the catalog each, done
    // before taking the lock).
    for each in markers.iter() {
        let held = each.load(Ordering::Acquire);
        if held != 0 && !database_exists((held >> 32) as u32) {
            let _ = each.compare_exchange(held, 0, Ordering::AcqRel, Ordering::Acquire);
        }
    }
    with_lock(table.free_list_lock(), pg_sys::LWLockMode::LW_EXCLUSIVE, || {
        let of_database = |each: &AtomicU64| each.load(Ordering::Relaxed) >> 32 == u64::from(database);
        let free = |each: &AtomicU64| each.load(Ordering::Relaxed) == 0;
        // More databases with fast leases than markers: one of them loses its marker, and its
        // next backends take the safe way of a reset once each.
        let at = markers.iter().position(of_database).or_else(|| markers.iter().position(free));
        markers[at.unwrap_or(database as usize % MARKERS)].store(marker, Ordering::Release);
    });
}

/// Whether database `oid` exists (pg_database is shared: any backend can look).
pub fn database_exists(oid: u32) -> bool {
    // SAFETY: a syscache lookup of a shared catalog, in a backend with a transaction.
    !unsafe { pg_sys::get_database_name(pg_sys::Oid::from(oid)) }.is_null()
}

/// Deletes `key`'s row of `slot` in `database` at once, outside any transaction: for the rows of a
/// dropped database, which no backend can be connected to.
pub fn delete_of_dropped_database(database: u32, key: &str, slot: i32) {
    let Some(table) = table() else { return };
    let [k0, k1] = table.header.secret;
    let mut hasher = SipHasher13::new_with_keys(k0, k1);
    hasher.write_u32(database);
    hasher.write(key.as_bytes());
    apply(Place { database, hash: hasher.finish() }, key, slot, None, false);
}

/// (rows in use, capacity, bytes per row), for fence.stats and the docs; None without preload.
pub fn usage() -> Option<(u32, u32, usize)> {
    let table = table()?;
    Some((table.header.used.load(Ordering::Relaxed), table.header.capacity, std::mem::size_of::<Cell>()))
}
