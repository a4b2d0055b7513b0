//! How the committed fast leases lie in shared memory (see `shared`): a fixed array of rows
//! (pg_fence.fast_leases of them), chained from a fixed array of buckets by a hash of (database,
//! key), so that one walk finds every slot of a key. Each bucket belongs to one of PARTITIONS
//! LWLocks; the list of free rows, and the rows charged to each role (`charges`), have a lock of
//! their own.
use super::row::Row;
use crate::pg::shmem::Region;
use pgrx::pg_sys;
use siphasher::sip::SipHasher13;
use std::hash::Hasher;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};

/// How many LWLocks share the buckets: concurrent changes of different keys rarely meet.
pub const PARTITIONS: usize = 128;

/// No row: the end of a chain, or of the free list.
pub(super) const NONE: u32 = u32::MAX;

#[repr(C)]
pub(super) struct Header {
    pub(super) capacity: u32,
    pub(super) buckets: u32,
    /// Rows in use, and rows reserved by transactions not yet ended.
    pub(super) used: AtomicU32,
    pub(super) reserved: AtomicU32,
    /// The head of the list of freed rows, and the first row never used (under the free list's
    /// lock): rows are touched only once used, so a large table costs memory only as it fills.
    pub(super) free: AtomicU32,
    pub(super) never_used: AtomicU32,
    /// The keys of the hash, drawn when the table is made: chains nobody can aim at.
    pub(super) secret: [u64; 2],
    /// Bumped at every change, for readers that cache nothing but want to know.
    pub(super) changes: AtomicU64,
    /// Drawn when the table is made: which shared memory a reset marker was written under (see
    /// `fences`), so that a marker outliving this memory's reset is known for what it is.
    pub(super) generation: u64,
    /// The highest fence of any row a grant freed because it needed room (see `changes`): every
    /// grant in every database starts above it, until the next reset, after which the fast
    /// reservation does (every fast fence is at most that).
    pub(super) freed: AtomicI64,
    /// The rows charged to each role (in use or reserved), under the free list's lock: an open
    /// addressing table by role OID, whose entries keep their role once taken (a count of 0 is
    /// free for another role), so that a lookup stops at the first never-used entry.
    pub(super) roles: [Charge; ROLES],
}

/// How many roles can have rows charged at once.
pub const ROLES: usize = 1024;

#[repr(C)]
pub(super) struct Charge {
    pub(super) role: AtomicU32,
    pub(super) rows: AtomicU32,
}

/// A row of the table: its key, where it chains, and the lease.
#[repr(C)]
pub(super) struct Cell {
    pub(super) next: AtomicU32,
    pub(super) database: u32,
    /// The role the row is charged to: the one whose lease took it last (see `recharge`).
    pub(super) role: u32,
    pub(super) hash: u64,
    pub(super) key_len: u16,
    pub(super) key: [u8; crate::pg::input::MAX_KEY_BYTES],
    pub(super) row: Row,
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
pub(super) struct Table {
    pub(super) header: &'static Header,
    pub(super) buckets: &'static [AtomicU32],
    pub(super) cells: *mut Cell,
    pub(super) locks: *mut pg_sys::LWLockPadded,
}

pub(super) fn table() -> Option<Table> {
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
    header.generation = rand_u64();
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
        // SAFETY: set for the life of a backend connected to a database.
        Place::in_database(unsafe { pg_sys::MyDatabaseId }.to_u32(), key)
    }

    /// `key`'s place in `database`, which may be another than this backend's.
    pub fn in_database(database: u32, key: &str) -> Option<Place> {
        let table = table()?;
        let [k0, k1] = table.header.secret;
        let mut hasher = SipHasher13::new_with_keys(k0, k1);
        hasher.write_u32(database);
        hasher.write(key.as_bytes());
        Some(Place { database, hash: hasher.finish() })
    }
}

impl Table {
    pub(super) fn bucket(&self, place: Place) -> usize {
        (place.hash as usize) & (self.buckets.len() - 1)
    }

    pub(super) fn lock_of(&self, bucket: usize) -> *mut pg_sys::LWLock {
        // SAFETY: PARTITIONS + 1 locks were asked for with the region.
        unsafe { &mut (*self.locks.add(bucket % PARTITIONS)).lock }
    }

    pub(super) fn free_list_lock(&self) -> *mut pg_sys::LWLock {
        // SAFETY: as above; the last one.
        unsafe { &mut (*self.locks.add(PARTITIONS)).lock }
    }

    /// SAFETY: `index` must be below the capacity; the caller holds the lock that guards the cell.
    pub(super) unsafe fn cell(&self, index: u32) -> *mut Cell {
        self.cells.add(index as usize)
    }
}

/// Runs `f` holding `lock` in `mode`. LWLocks are released by PostgreSQL at an error too.
pub(super) fn with_lock<R>(
    lock: *mut pg_sys::LWLock,
    mode: pg_sys::LWLockMode::Type,
    f: impl FnOnce() -> R,
) -> R {
    // SAFETY: a lock of this region's tranche; held only around memory reads and writes.
    unsafe { pg_sys::LWLockAcquire(lock, mode) };
    let result = f();
    // SAFETY: as above.
    unsafe { pg_sys::LWLockRelease(lock) };
    result
}

pub(super) fn is_of(cell: &Cell, place: Place, key: &str) -> bool {
    cell.hash == place.hash
        && cell.database == place.database
        && &cell.key[..cell.key_len as usize] == key.as_bytes()
}

/// Calls `f` with every cell chained from the `count` buckets from `from` on (each bucket read
/// under its lock); returns where to go on, 0 after the last.
pub(super) fn each_cell(from: usize, count: usize, mut f: impl FnMut(&Cell)) -> usize {
    let Some(table) = table() else { return 0 };
    let end = from.saturating_add(count).min(table.buckets.len());
    for bucket in from..end {
        with_lock(table.lock_of(bucket), pg_sys::LWLockMode::LW_SHARED, || {
            let mut at = table.buckets[bucket].load(Ordering::Relaxed);
            while at != NONE {
                // SAFETY: a cell of this bucket's chain, read under its lock.
                let cell = unsafe { &*table.cell(at) };
                f(cell);
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

pub(super) fn cell_key(cell: &Cell) -> &str {
    std::str::from_utf8(&cell.key[..cell.key_len as usize]).unwrap_or_default()
}

/// Where `key`'s row of `slot` is in its bucket's chain: (the cell before it, its cell), NONE for
/// either when there is none. The caller holds the bucket's lock.
pub(super) fn position(table: &Table, bucket: usize, place: Place, key: &str, slot: i32) -> (u32, u32) {
    let (mut previous, mut at) = (NONE, table.buckets[bucket].load(Ordering::Relaxed));
    while at != NONE {
        // SAFETY: a cell of this bucket's chain, under its lock.
        let cell = unsafe { &*table.cell(at) };
        if is_of(cell, place, key) && cell.row.slot == slot {
            break;
        }
        (previous, at) = (at, cell.next.load(Ordering::Relaxed));
    }
    (previous, at)
}
