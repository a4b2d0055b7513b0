//! The `pg_fence.*` configuration parameters and typed accessors for them.
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};
use std::ffi::{CStr, CString};
use std::time::Duration;

/// Longest TTL, in seconds, that lease_acquire and lease_renew accept.
static MAX_TTL_SECONDS: GucSetting<i32> = GucSetting::<i32>::new(86_400);

/// The database the sweeper worker connects to (postmaster start only).
static DATABASE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c"postgres"));

/// How often the sweeper worker sweeps, in milliseconds.
static SWEEP_INTERVAL_MS: GucSetting<i32> = GucSetting::<i32>::new(1_000);

/// How long the sweep keeps the row of a key whose lease has ended, in seconds.
static RETAIN_ENDED_SECONDS: GucSetting<i32> = GucSetting::<i32>::new(3_600);

/// Whether the counters of fence.stats are kept.
static TRACK_STATS: GucSetting<bool> = GucSetting::<bool>::new(true);

/// Whether lease changes are announced with NOTIFY on channel pg_fence.
static NOTIFY: GucSetting<bool> = GucSetting::<bool>::new(false);

/// Whether those announcements name the key.
static NOTIFY_KEYS: GucSetting<bool> = GucSetting::<bool>::new(false);

/// How many rows shared memory keeps for fast leases (postmaster start only).
static FAST_LEASES: GucSetting<i32> = GucSetting::<i32>::new(10_000);

/// How many rows of fast leases in shared memory one role may have.
static FAST_LEASES_PER_ROLE: GucSetting<i32> = GucSetting::<i32>::new(1_000);

/// Whether each change to a fast lease in shared memory is handed to a tracing function (tests).
static TRACE_FAST_CHANGES: GucSetting<bool> = GucSetting::<bool>::new(false);

/// How long, in milliseconds, an observer's session waits after an answer of await_change that told
/// a change before it looks at the key again.
static OBSERVE_INTERVAL_MS: GucSetting<i32> = GucSetting::<i32>::new(50);

/// How long, in milliseconds, a guard may hold back a waiting grant before the sweeper worker ends
/// its backend (0: never).
static GUARD_TIMEOUT_MS: GucSetting<i32> = GucSetting::<i32>::new(0);

pub fn init() {
    GucRegistry::define_bool_guc(
        c"pg_fence.notify",
        c"Announce lease changes with NOTIFY on channel pg_fence.",
        c"Off by default: each NOTIFY costs the changing transaction a write to the notification queue \
          at commit, whether anyone listens or not. Turn it on for the database (ALTER DATABASE ... SET) \
          so that every session, and the sweeper, announces.",
        &NOTIFY,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"pg_fence.trace_fast_changes",
        c"For pg_fence's own tests: hand each change to a fast lease in shared memory to \
          fence.trace_fast_change.",
        c"Shared memory has no table to put triggers on; the torture test records the history of \
          fast leases with this. Superuser-only.",
        &TRACE_FAST_CHANGES,
        GucContext::Suset,
        GucFlags::NO_SHOW_ALL,
    );
    GucRegistry::define_bool_guc(
        c"pg_fence.notify_keys",
        c"Name the key in pg_fence's NOTIFY announcements.",
        c"Off by default: every role may LISTEN on channel pg_fence, including roles refused \
          fence.leases, and keys are often business identifiers. Superuser-only.",
        &NOTIFY_KEYS,
        GucContext::Suset,
        GucFlags::default(),
    );
    // A postmaster-context setting can only be defined while the postmaster loads preloaded
    // libraries (PostgreSQL refuses it later, FATALly); without preload there is no worker anyway.
    // SAFETY: a backend-global flag set by the postmaster.
    if unsafe { pgrx::pg_sys::process_shared_preload_libraries_in_progress } {
        GucRegistry::define_string_guc(
            c"pg_fence.database",
            c"Database in which the pg_fence sweeper worker runs.",
            c"Only with pg_fence in shared_preload_libraries; takes effect at server start.",
            &DATABASE,
            GucContext::Postmaster,
            GucFlags::default(),
        );
        GucRegistry::define_int_guc(
            c"pg_fence.fast_leases",
            c"How many fast leases' rows shared memory keeps (one per key and holder).",
            c"Only with pg_fence in shared_preload_libraries; takes effect at server start. A row stays \
              until the sweep removes it, pg_fence.retain_ended after its lease ended.",
            &FAST_LEASES,
            0,
            100_000_000,
            GucContext::Postmaster,
            GucFlags::default(),
        );
    }
    GucRegistry::define_int_guc(
        c"pg_fence.fast_leases_per_role",
        c"How many rows of fast leases in shared memory one role may have, in use or reserved.",
        c"The rows of pg_fence.fast_leases are shared by every database and role: this keeps one \
          role from taking them all. A row is charged to the role whose lease took it last. \
          Reloadable (SIGHUP).",
        &FAST_LEASES_PER_ROLE,
        1,
        100_000_000,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"pg_fence.track_stats",
        c"Keep the counters of fence.stats.",
        c"On by default; they need pg_fence in shared_preload_libraries. Reloadable (SIGHUP): off \
          is for measuring what counting costs.",
        &TRACK_STATS,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_fence.sweep_interval",
        c"How often the pg_fence sweeper worker ends expired leases.",
        c"Reloadable (SIGHUP). Correctness never depends on the sweeper; it only tidies up.",
        &SWEEP_INTERVAL_MS,
        10,
        86_400_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"pg_fence.retain_ended",
        c"How long fence.sweep() keeps a key's row after its lease has ended.",
        c"Afterwards the row is deleted: fence.leases no longer lists the key and current_fence() \
          returns NULL, and its next grant still gets a higher fence. Reloadable, and settable per \
          database (ALTER DATABASE ... SET) by a superuser.",
        &RETAIN_ENDED_SECONDS,
        0,
        i32::MAX,
        GucContext::Suset,
        GucFlags::UNIT_S,
    );
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
    GucRegistry::define_int_guc(
        c"pg_fence.guard_timeout",
        c"How long a guard may hold back a waiting grant before the sweeper worker ends its backend.",
        c"0 (the default) never ends one. The sweeper worker (preload) terminates the backend whose \
          transaction holds a key's guard while a grant of that key has waited this long; a prepared \
          transaction is only reported. Reloadable (SIGHUP).",
        &GUARD_TIMEOUT_MS,
        0,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"pg_fence.observe_interval",
        c"The least time between two answers of fence.await_change that tell a change of a key, per session.",
        c"A key that changes faster is seen at this pace, its latest state each time, so that its \
          observers cost its holders and acquirers little. Superuser-only (ALTER ROLE ... SET for \
          an observer that needs another pace).",
        &OBSERVE_INTERVAL_MS,
        0,
        60_000,
        GucContext::Suset,
        GucFlags::UNIT_MS,
    );
    // SAFETY: reserves the prefix, as an extension's _PG_init does after defining its settings.
    unsafe {
        pgrx::pg_sys::MarkGUCPrefixReserved(c"pg_fence".as_ptr());
    }
}

pub fn max_ttl_micros() -> i64 {
    i64::from(MAX_TTL_SECONDS.get()) * 1_000_000
}

pub fn retain_ended_micros() -> i64 {
    i64::from(RETAIN_ENDED_SECONDS.get()) * 1_000_000
}

pub fn database() -> String {
    DATABASE.get().map(|db| db.to_string_lossy().into_owned()).unwrap_or_else(|| "postgres".into())
}

pub fn sweep_interval() -> Duration {
    Duration::from_millis(SWEEP_INTERVAL_MS.get().max(10) as u64)
}

/// pg_fence.guard_timeout; None when off.
pub fn observe_interval() -> Duration {
    Duration::from_millis(OBSERVE_INTERVAL_MS.get().max(0) as u64)
}

pub fn guard_timeout() -> Option<Duration> {
    let ms = GUARD_TIMEOUT_MS.get();
    (ms > 0).then(|| Duration::from_millis(ms as u64))
}

pub fn stats() -> bool {
    TRACK_STATS.get()
}

pub fn fast_leases() -> usize {
    usize::try_from(FAST_LEASES.get()).unwrap_or(0)
}

pub fn fast_leases_per_role() -> u32 {
    u32::try_from(FAST_LEASES_PER_ROLE.get()).unwrap_or(1)
}

pub fn trace_fast_changes() -> bool {
    TRACE_FAST_CHANGES.get()
}

pub fn notify() -> bool {
    NOTIFY.get()
}

pub fn notify_keys() -> bool {
    NOTIFY_KEYS.get()
}

/// Sets one of PostgreSQL's own user-settable GUCs from inside pg_fence: `GUC_ACTION_LOCAL` is
/// `SET LOCAL` (undone at transaction end), `GUC_ACTION_SAVE` a function's SET clause (undone by
/// AtEOXact_GUC at the nesting level the caller opened).
pub fn set_server_setting(name: &CStr, value: &CStr, action: pgrx::pg_sys::GucAction::Type) {
    use pgrx::pg_sys;
    // SAFETY: what `SELECT set_config(name, value, ...)` does, for a PGC_USERSET setting.
    unsafe {
        pg_sys::set_config_option(
            name.as_ptr(),
            value.as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
            action,
            true,
            0,
            false,
        );
    }
}
