//! The `pg_fence.*` configuration parameters and typed accessors for them.
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};

/// Longest TTL, in seconds, that lease_acquire and lease_renew accept.
static MAX_TTL_SECONDS: GucSetting<i32> = GucSetting::<i32>::new(86_400);

pub fn init() {
    GucRegistry::define_int_guc(
        c"pg_fence.max_ttl",
        c"Longest lease TTL that lease_acquire and lease_renew accept.",
        c"A guard rail against leases that outlive their holder by days. Superuser-only, so an \
          application cannot raise its own limit.",
        &MAX_TTL_SECONDS,
        1,
        i32::MAX,
        GucContext::Suset,
        GucFlags::UNIT_S,
    );
    #[cfg(not(any(feature = "pg13", feature = "pg14")))]
    unsafe {
        pgrx::pg_sys::MarkGUCPrefixReserved(c"pg_fence".as_ptr());
    }
}

pub fn max_ttl_micros() -> i64 {
    i64::from(MAX_TTL_SECONDS.get()) * 1_000_000
}
