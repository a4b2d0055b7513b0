//! Raising pg_fence's own SQLSTATEs (class PF) from Rust.
//!
//! pgrx raises only the codes of its closed `PgSqlErrorCode` enum (any other becomes XX000). A SQL
//! shell calling a PL/pgSQL raiser could raise a PF code, but PostgreSQL inlines a SQL shell into
//! every statement that calls it, parsing and analysing its body each time the statement is planned:
//! a cost paid by every fenced write sent as plain SQL (docs/benchmarks.md).
//!
//! So those functions are C entry points instead (`entry_point!`): each calls its core's pgrx
//! wrapper, which answers "no" as NULL or false and raises its ordinary errors itself, and on "no"
//! calls PostgreSQL's ereport functions directly, as pgrx does for its own errors. ereport at ERROR
//! leaves by longjmp, skipping Rust destructors; so the entry point and `raise` hold nothing that has
//! one (the message is built first, under pgrx's guard, into palloc'd C strings).
//!
//! Calling a core directly skips the function-call layer for the core itself: its EXECUTE grant,
//! SECURITY DEFINER and SET clauses do not apply (the cores used so are plain caller-rights
//! functions), so access is controlled on the public functions.
//!
//! A core that is SECURITY DEFINER (lease_renew's) cannot be called this way: only a call through
//! fmgr switches the user. lease_renew stays a SQL shell.
use pgrx::pg_sys;
use std::ffi::{c_char, c_int, CStr};

/// PF002 stale_fence: a write under a fence that is no longer the key's live one.
pub const STALE_FENCE: &[u8; 5] = b"PF002";

/// Defines the C entry point `$symbol` (with its `pg_finfo_` record `$finfo`) of a public function:
/// it answers what `$core` (a pgrx wrapper, called with this call's arguments) answers, unless
/// `$refused(answer, is_null)`, when it raises the error `$message(fcinfo)` describes.
macro_rules! entry_point {
    ($symbol:ident, $finfo:ident, $core:path, $refused:expr, $message:path) => {
        #[no_mangle]
        #[doc(hidden)]
        pub extern "C" fn $finfo() -> &'static pgrx::pg_sys::Pg_finfo_record {
            const V1: pgrx::pg_sys::Pg_finfo_record = pgrx::pg_sys::Pg_finfo_record { api_version: 1 };
            &V1
        }

        #[no_mangle]
        #[doc(hidden)]
        pub unsafe extern "C-unwind" fn $symbol(
            fcinfo: pgrx::pg_sys::FunctionCallInfo,
        ) -> pgrx::pg_sys::Datum {
            let answer = $core(fcinfo);
            let refused: fn(pgrx::pg_sys::Datum, bool) -> bool = $refused;
            if !refused(answer, (*fcinfo).isnull) {
                return answer;
            }
            // Built under pgrx's guard, so that an error while building it (out of memory, say) is
            // raised as any other; then raised with nothing that has a destructor on the stack.
            let message = pgrx::pgrx_extern_c_guard(|| $message(fcinfo));
            $crate::pg::own_errors::raise(message)
        }
    };
}
pub(crate) use entry_point;

/// An error to raise, all of it in memory PostgreSQL owns.
pub struct Message {
    pub code: &'static [u8; 5],
    /// palloc'd
    pub text: *const c_char,
    /// palloc'd
    pub detail: *const c_char,
    pub hint: &'static CStr,
}

/// Copies `text` into memory PostgreSQL owns, for a `Message`.
pub fn palloc_copy(text: &str) -> *const c_char {
    let text = text.replace('\0', "");
    // SAFETY: pnstrdup copies exactly `len` bytes and adds the terminating NUL.
    unsafe { pg_sys::pnstrdup(text.as_ptr().cast(), text.len()) }
}

/// Raises `message` at ERROR.
///
/// SAFETY: this longjmps out; no frame between here and PostgreSQL may hold a value that has a
/// destructor (see the module comment).
pub unsafe fn raise(message: Message) -> ! {
    // Declared here, as pgrx declares them: its bindings wrap every call in a guard that would turn
    // the error into one of its own, losing the SQLSTATE.
    unsafe extern "C-unwind" {
        fn errstart(elevel: c_int, domain: *const c_char) -> bool;
        fn errcode(sqlerrcode: c_int) -> c_int;
        fn errmsg(fmt: *const c_char, ...) -> c_int;
        fn errdetail(fmt: *const c_char, ...) -> c_int;
        fn errhint(fmt: *const c_char, ...) -> c_int;
        fn errfinish(filename: *const c_char, lineno: c_int, funcname: *const c_char);
    }
    let sqlstate =
        message.code.iter().rev().fold(0, |code, &c| (code << 6) | ((c as c_int - b'0' as c_int) & 0x3f));
    if errstart(pgrx::PgLogLevel::ERROR as c_int, std::ptr::null()) {
        errcode(sqlstate);
        errmsg(c"%s".as_ptr(), message.text);
        errdetail(c"%s".as_ptr(), message.detail);
        errhint(c"%s".as_ptr(), message.hint.as_ptr());
        errfinish(c"own_errors.rs".as_ptr(), line!() as c_int, c"raise".as_ptr());
    }
    unreachable!("errfinish does not return at ERROR")
}
