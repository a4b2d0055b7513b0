//! Shared memory whose size is known only once the server's settings are (max_connections, say),
//! which pgrx's `pg_shmem_init!` cannot size. Like it, a region must be asked for while the
//! postmaster preloads pg_fence (shared_preload_libraries): `Region::request` from _PG_init.
//!
//! The postmaster places each region when it creates shared memory, and again when it creates it
//! anew after a backend crashed; every backend it forks afterwards inherits the address.
use pgrx::pg_sys;
use std::ffi::CStr;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;

pub struct Region {
    name: &'static CStr,
    /// Its size in bytes, asked when the server's settings are final.
    size: fn() -> usize,
    /// Sets up the region when it is placed, in the postmaster, before any backend exists; what it
    /// does not write may hold anything.
    format: fn(*mut u8, usize),
    /// How many LWLocks of its own (a tranche named as the region) it comes with.
    locks: usize,
    base: AtomicPtr<u8>,
    len: AtomicUsize,
    lock_array: AtomicPtr<pg_sys::LWLockPadded>,
}

impl Region {
    pub const fn with_locks(
        name: &'static CStr,
        size: fn() -> usize,
        format: fn(*mut u8, usize),
        locks: usize,
    ) -> Region {
        Region {
            name,
            size,
            format,
            locks,
            base: AtomicPtr::new(std::ptr::null_mut()),
            len: AtomicUsize::new(0),
            lock_array: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// Asks for the region; call it from _PG_init, where it does nothing unless preloading.
    pub fn request(&'static self) {
        // SAFETY: a backend-global flag set by the postmaster.
        if !unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
            return;
        }
        let mut regions = REGIONS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if regions.is_empty() {
            // SAFETY: hooks are installed in the postmaster, single-threaded, while it preloads.
            unsafe {
                PREVIOUS_REQUEST_HOOK = pg_sys::shmem_request_hook;
                pg_sys::shmem_request_hook = Some(request_all);
                PREVIOUS_STARTUP_HOOK = pg_sys::shmem_startup_hook;
                pg_sys::shmem_startup_hook = Some(place_all);
            }
        }
        regions.push(self);
    }

    /// The region, formatted when it was placed; None when pg_fence was not preloaded.
    pub fn bytes(&self) -> Option<(*mut u8, usize)> {
        let base = self.base.load(Relaxed);
        (!base.is_null()).then(|| (base, self.len.load(Relaxed)))
    }

    /// Its LWLocks (as many as asked for); null without preload.
    pub fn locks(&self) -> *mut pg_sys::LWLockPadded {
        self.lock_array.load(Relaxed)
    }
}

static REGIONS: Mutex<Vec<&'static Region>> = Mutex::new(Vec::new());
static mut PREVIOUS_REQUEST_HOOK: pg_sys::shmem_request_hook_type = None;
static mut PREVIOUS_STARTUP_HOOK: pg_sys::shmem_startup_hook_type = None;

fn regions() -> Vec<&'static Region> {
    REGIONS.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn request_all() {
    // SAFETY: the hook chain as PostgreSQL documents it, in the postmaster.
    unsafe {
        if let Some(previous) = PREVIOUS_REQUEST_HOOK {
            previous();
        }
        for region in regions() {
            pg_sys::RequestAddinShmemSpace((region.size)());
            if region.locks > 0 {
                pg_sys::RequestNamedLWLockTranche(region.name.as_ptr(), region.locks as i32);
            }
        }
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn place_all() {
    // SAFETY: the hook chain as PostgreSQL documents it; ShmemInitStruct returns memory of the
    // requested size, which nothing else uses yet when `found` is false.
    unsafe {
        if let Some(previous) = PREVIOUS_STARTUP_HOOK {
            previous();
        }
        for region in regions() {
            let len = (region.size)();
            let mut found = false;
            let base = pg_sys::ShmemInitStruct(region.name.as_ptr(), len, &mut found).cast::<u8>();
            if !found {
                (region.format)(base, len);
            }
            if region.locks > 0 {
                region.lock_array.store(pg_sys::GetNamedLWLockTranche(region.name.as_ptr()), Relaxed);
            }
            region.len.store(len, Relaxed);
            region.base.store(base, Relaxed);
        }
    }
}
