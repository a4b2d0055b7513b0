//! Per-backend caches of catalog look-ups, and the flag that tells them the catalogs changed:
//! PostgreSQL calls back for each change announced to the given syscaches (read when syscache
//! look-ups would read them), so a kept value is never older than a fresh look-up's would be.
use pgrx::pg_sys;

/// A callback PostgreSQL makes for a change to one of a syscache's entries.
pub type Callback = unsafe extern "C-unwind" fn(pg_sys::Datum, std::ffi::c_int, u32);

/// Registers `callback` for each of `catalogs`, for the life of the backend. (PostgreSQL has room
/// for 64 syscache callbacks per backend; callers register theirs once.)
pub fn register(catalogs: &[pg_sys::SysCacheIdentifier::Type], callback: Callback) {
    for &catalog in catalogs {
        // SAFETY: a callback for the life of the backend, as PostgreSQL's own modules register them.
        unsafe { pg_sys::CacheRegisterSyscacheCallback(catalog as i32, Some(callback), 0.into()) };
    }
}
