//! A look at the tables that leaves no lock behind.
use pgrx::pg_sys;
use pgrx::PgTryBuilder;
use std::panic::AssertUnwindSafe;

/// Runs `look` (which must change nothing) in a subtransaction that is then rolled back, so that
/// the locks its reads took (AccessShareLock on pg_fence's tables) are let go at once instead of at
/// the end of the caller's transaction: a call that waits between looks must not keep DROP or
/// ALTER EXTENSION, and every lease call queued behind them, waiting. After an error and the
/// rollback, `on_error` runs (it may raise an error of its own), then the error is raised again.
pub fn without_keeping_locks<R>(look: impl FnOnce() -> R, on_error: fn()) -> R {
    // SAFETY: the sequence PL/pgSQL's exec_stmt_block uses around an EXCEPTION block: the memory
    // context and resource owner are restored on both paths.
    unsafe {
        let memory = pg_sys::CurrentMemoryContext;
        let resource_owner = pg_sys::CurrentResourceOwner;
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(memory);
        let result = PgTryBuilder::new(AssertUnwindSafe(|| {
            let result = look();
            pg_sys::RollbackAndReleaseCurrentSubTransaction();
            result
        }))
        .catch_others(|error| {
            pg_sys::MemoryContextSwitchTo(memory);
            pg_sys::RollbackAndReleaseCurrentSubTransaction();
            pg_sys::CurrentResourceOwner = resource_owner;
            on_error();
            error.rethrow()
        })
        .execute();
        pg_sys::MemoryContextSwitchTo(memory);
        pg_sys::CurrentResourceOwner = resource_owner;
        result
    }
}
