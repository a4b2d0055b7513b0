//! Argument checks shared by the public functions. Each either returns the checked value or raises
//! an error before anything has been read, locked or changed.
use crate::pg::errors;
use crate::pg::settings;
use pgrx::datum::Interval;

/// Keys are compared and indexed whole; a bound keeps index entries far below btree's size limit.
pub const MAX_KEY_BYTES: usize = 512;
/// 100 years as intervals count them (a year is 12 months of 30 days): far beyond any real wait,
/// and far from overflowing timestamps when added to the clock.
const MAX_WAIT_MICROS: i64 = 100 * 12 * 30 * 86_400 * 1_000_000;
/// Owner labels are for humans reading fence.leases; a bound keeps the table small.
pub const MAX_OWNER_BYTES: usize = 256;

/// A required argument: its value, or the null_value_not_allowed error naming it.
pub fn required<T>(value: Option<T>, argument: &str) -> T {
    value.unwrap_or_else(|| errors::null_argument(argument))
}

pub fn key(key: Option<&str>) -> &str {
    let key = required(key, "key");
    if key.is_empty() {
        errors::invalid_argument(
            "key must not be empty".into(),
            "Name the resource the lease protects, for example 'invoice:42'.",
        );
    }
    if key.len() > MAX_KEY_BYTES {
        errors::invalid_argument(
            format!("key is {} bytes long, more than the limit of {MAX_KEY_BYTES}", key.len()),
            "Use a shorter key, for example a hash of the long name.",
        );
    }
    key
}

/// The most keys a lease set may have: each takes a key lock and, while it waits, a waiting-room
/// lock, in the shared lock table that max_locks_per_transaction sizes.
pub const MAX_SET_KEYS: usize = 64;

/// The keys of a lease set, each checked as `key`, sorted by their bytes (the order in which every
/// set takes its keys' locks).
pub fn key_set(keys: Option<Vec<Option<String>>>) -> Vec<String> {
    let keys = required(keys, "keys");
    let hint = "Pass an array of 1 to 64 distinct, non-empty keys, such as ARRAY['invoice:1', 'invoice:2'].";
    if keys.is_empty() {
        errors::invalid_argument("keys must not be empty".into(), hint);
    }
    if keys.len() > MAX_SET_KEYS {
        errors::invalid_argument(
            format!("keys has {} elements, more than the limit of {MAX_SET_KEYS}", keys.len()),
            hint,
        );
    }
    let mut keys: Vec<String> = keys
        .into_iter()
        .map(|key| key.unwrap_or_else(|| errors::null_argument("an element of keys")))
        .collect();
    for each in &keys {
        key(Some(each));
    }
    keys.sort();
    if let Some(twice) = keys.windows(2).find(|pair| pair[0] == pair[1]) {
        errors::invalid_argument(format!("key \"{}\" appears more than once in keys", twice[0]), hint);
    }
    keys
}

/// The most keys lease_acquire_any tries in one call: each try is a read of the key's rows.
pub const MAX_ANY_KEYS: usize = 1_000;

/// lease_acquire_any's keys, each checked as `key`, distinct, in the caller's order.
pub fn key_list(keys: Option<Vec<Option<String>>>) -> Vec<String> {
    let keys = required(keys, "keys");
    let hint = "Pass an array of 1 to 1000 distinct, non-empty keys in the order to try them, such as \
                ARRAY['invoice:1', 'invoice:2'].";
    if keys.is_empty() {
        errors::invalid_argument("keys must not be empty".into(), hint);
    }
    if keys.len() > MAX_ANY_KEYS {
        errors::invalid_argument(
            format!("keys has {} elements, more than the limit of {MAX_ANY_KEYS}", keys.len()),
            hint,
        );
    }
    let keys: Vec<String> = keys
        .into_iter()
        .map(|key| key.unwrap_or_else(|| errors::null_argument("an element of keys")))
        .collect();
    for each in &keys {
        key(Some(each));
    }
    let mut sorted: Vec<&String> = keys.iter().collect();
    sorted.sort();
    if let Some(twice) = sorted.windows(2).find(|pair| pair[0] == pair[1]) {
        errors::invalid_argument(format!("key \"{}\" appears more than once in keys", twice[0]), hint);
    }
    keys
}

/// The most leases lease_renew_many renews in one call: each keeps its key's lock until the
/// transaction ends, in the shared lock table that max_locks_per_transaction sizes (as a set).
pub const MAX_RENEWALS: usize = MAX_SET_KEYS;

/// lease_renew_many's leases: (key, token, ttl in µs) for each position of the three arrays, which
/// must be of one length; each element checked as lease_renew checks it.
pub fn renewals(
    keys: Option<Vec<Option<String>>>,
    tokens: Option<Vec<Option<pgrx::Uuid>>>,
    ttls: Option<Vec<Option<Interval>>>,
) -> Vec<(String, pgrx::Uuid, i64)> {
    let (keys, tokens, ttls) = (required(keys, "keys"), required(tokens, "tokens"), required(ttls, "ttls"));
    let hint = "Pass three arrays of one length, at most 64: each lease's key, its token and its new ttl, \
                such as ARRAY['a', 'b'], ARRAY[token_a, token_b], ARRAY['30 s', '30 s']::interval[].";
    if keys.len() != tokens.len() || keys.len() != ttls.len() {
        errors::invalid_argument(
            format!(
                "keys, tokens and ttls must be of one length, got {}, {} and {}",
                keys.len(),
                tokens.len(),
                ttls.len()
            ),
            hint,
        );
    }
    if keys.len() > MAX_RENEWALS {
        errors::invalid_argument(
            format!("{} leases to renew, more than the limit of {MAX_RENEWALS} in one call", keys.len()),
            "Renew the others in another call.",
        );
    }
    keys.into_iter()
        .zip(tokens)
        .zip(ttls)
        .map(|((each_key, token), each_ttl)| {
            let each_key = required(each_key, "an element of keys");
            key(Some(&each_key));
            let token = required(token, "an element of tokens");
            (each_key, token, ttl(Some(required(each_ttl, "an element of ttls"))))
        })
        .collect()
}

/// Returns the TTL in microseconds. Months count as 30 days, as in interval comparisons.
pub fn ttl(ttl: Option<Interval>) -> i64 {
    let ttl = required(ttl, "ttl");
    let hint = "Pass a positive, finite interval no longer than pg_fence.max_ttl, such as '30 seconds'.";
    if is_infinite(&ttl) {
        errors::invalid_argument("ttl must be finite".into(), hint);
    }
    let micros = ttl.as_micros();
    if micros <= 0 {
        errors::invalid_argument(format!("ttl must be positive, got {ttl}"), hint);
    }
    let max = settings::max_ttl_micros();
    if micros > i128::from(max) {
        errors::invalid_argument(
            format!("ttl {ttl} exceeds pg_fence.max_ttl ({} s)", max / 1_000_000),
            "Renew the lease periodically instead, or ask a superuser to raise pg_fence.max_ttl.",
        );
    }
    micros as i64
}

/// Returns how long lease_acquire may wait, in microseconds (0: not at all).
pub fn wait(wait: Option<Interval>) -> i64 {
    duration(wait, "wait", "Pass how long to wait for the key, such as '5 seconds', or '0' not to wait.")
}

/// Returns how long await_change may wait for a change, in microseconds (0: not at all).
pub fn timeout(timeout: Option<Interval>) -> i64 {
    duration(
        timeout,
        "timeout",
        "Pass how long to wait for a change, such as '30 seconds', or '0' not to wait.",
    )
}

/// The longest lock_delay: a key kept from every grant for longer is an outage, not a safety margin.
pub const MAX_LOCK_DELAY_MICROS: i64 = 3_600_000_000;

/// Returns lease_acquire's lock_delay, in microseconds (0: none).
pub fn lock_delay(lock_delay: Option<Interval>) -> i64 {
    let hint = "Pass how long nobody may be granted the key after this lease ends other than by a release, \
                such as '15 seconds', at most '1 hour'; '0' for no delay.";
    let micros = duration(lock_delay, "lock_delay", hint);
    if micros > MAX_LOCK_DELAY_MICROS {
        errors::invalid_argument("lock_delay must be at most 1 hour".into(), hint);
    }
    micros
}

/// A wait of `argument`: finite, not negative, at most 100 years.
fn duration(value: Option<Interval>, argument: &str, hint: &str) -> i64 {
    let value = required(value, argument);
    let micros = value.as_micros();
    if is_infinite(&value) {
        errors::invalid_argument(format!("{argument} must be finite"), hint);
    }
    if micros > i128::from(MAX_WAIT_MICROS) {
        errors::invalid_argument(format!("{argument} {value} is longer than the limit of 100 years"), hint);
    }
    if micros < 0 {
        errors::invalid_argument(format!("{argument} must not be negative, got {value}"), hint);
    }
    micros as i64
}

fn is_infinite(interval: &Interval) -> bool {
    let inner = interval.into_inner();
    inner.month.unsigned_abs() == i32::MAX.unsigned_abs()
        && inner.day.unsigned_abs() == i32::MAX.unsigned_abs()
}

/// NULL or empty means "whoever is calling": application_name, or pid:<backend pid> without one.
pub fn owner(owner: Option<&str>) -> String {
    match owner {
        Some(owner) if owner.len() > MAX_OWNER_BYTES => errors::invalid_argument(
            format!("owner is {} bytes long, more than the limit of {MAX_OWNER_BYTES}", owner.len()),
            "Use a short label such as a host name and process id.",
        ),
        Some(owner) if !owner.is_empty() => owner.to_string(),
        _ => default_owner(),
    }
}

fn default_owner() -> String {
    // SAFETY: application_name is a GUC string PostgreSQL keeps valid (possibly NULL) for the session.
    let app = unsafe {
        let name = pgrx::pg_sys::application_name;
        (!name.is_null()).then(|| std::ffi::CStr::from_ptr(name).to_string_lossy().into_owned())
    };
    match app {
        Some(app) if !app.is_empty() => app,
        _ => format!("pid:{}", unsafe { pgrx::pg_sys::MyProcPid }),
    }
}

/// A caller's own token for lease_acquire: any uuid but the nil one, which is no secret.
pub fn token(token: pgrx::Uuid) -> pgrx::Uuid {
    if token.as_bytes().iter().all(|&b| b == 0) {
        errors::invalid_argument(
            "token must not be the nil uuid".into(),
            "Pass a random uuid, such as gen_random_uuid() or uuid.uuid4(), and the same one when you retry.",
        );
    }
    token
}
