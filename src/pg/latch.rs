//! This backend's latch, which every wait of pg_fence sleeps on: a waiting acquire, an observer,
//! the first grant after a reset (see `leases::state::fences`). Whoever changes what it waits for
//! sets it (`leases::line::wakeups`).
use pgrx::pg_sys;

/// Forgets earlier wake-ups: call before looking at the key, then `sleep`. A wake-up that comes in
/// between makes `sleep` return at once, so none is lost. A waiter whose client has gone ends here
/// (see `end_if_client_gone`), at every look, whether it slept on the latch or queued in a lock wait.
pub fn arm() {
    // SAFETY: MyLatch is this backend's own latch.
    unsafe { pg_sys::ResetLatch(pg_sys::MyLatch) };
    end_if_client_gone();
}

/// Sleeps until woken or for `micros` at most; query cancel and statement_timeout end it (with
/// their error). Shows in pg_stat_activity as wait_event_type 'Extension'.
pub fn sleep(micros: i64) {
    let timeout_ms = super::clock::millis_rounded_up(micros).clamp(1, i64::from(i32::MAX));
    let events = pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH;
    // SAFETY: the standard latch wait of a backend; interrupts are processed right after.
    unsafe {
        pg_sys::WaitLatch(pg_sys::MyLatch, events as i32, timeout_ms as _, pg_sys::PG_WAIT_EXTENSION);
    }
    pgrx::check_for_interrupts!();
}

extern "C-unwind" {
    /// libpq/pqcomm.c (PostgreSQL 14 and later): false once the client has closed its connection.
    /// It may reset the latch.
    fn pq_check_connection() -> bool;
}

/// Ends the call when its client has gone (its process exited or was killed: the connection is
/// closed), as PostgreSQL ends a query whose client it finds gone: FATAL "connection to client
/// lost" (08006), rather than go on to be granted what nobody can use or release. PostgreSQL
/// looks only when `client_connection_check_interval` is set (off by default). Called by `arm`,
/// after its reset: a wake-up the check swallows (it may reset the latch) came before the look
/// that follows. The server sees only its own socket: a pooler's connection stays open, and a
/// host that vanished shows only once TCP keepalives give up.
fn end_if_client_gone() {
    // SAFETY: MyProcPort is non-null only in a backend that serves a client, whose socket the check
    // polls without waiting; the flags are those PostgreSQL sets when it finds its client gone, and
    // the interrupt check raises the FATAL.
    unsafe {
        // An error it raises (a failed epoll call) comes back as a Rust panic, and so as an ERROR.
        if pg_sys::MyProcPort.is_null() || pg_sys::ffi::pg_guard_ffi_boundary(|| pq_check_connection()) {
            return;
        }
        pg_sys::ClientConnectionLost = 1;
        pg_sys::InterruptPending = 1;
    }
    pgrx::check_for_interrupts!();
}

/// Sleeps for `micros` whatever sets the latch meanwhile (a wake-up then waits for the next
/// `sleep`); query cancel and statement_timeout end it within 10 ms.
pub fn pause(micros: i64) {
    let end = std::time::Instant::now() + std::time::Duration::from_micros(micros.max(0) as u64);
    let events = pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH;
    loop {
        let left = end.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return;
        }
        let timeout_ms = left.as_millis().clamp(1, 10) as std::ffi::c_long;
        // SAFETY: a timed wait without the latch (WaitLatch ignores it without WL_LATCH_SET).
        unsafe {
            pg_sys::WaitLatch(std::ptr::null_mut(), events as i32, timeout_ms, pg_sys::PG_WAIT_EXTENSION);
        }
        pgrx::check_for_interrupts!();
    }
}
