//! In-backend tests of each function. Each test runs inside a transaction that is rolled back;
//! commits, concurrency and crashes are tested from outside (tests/), and bad arguments by
//! pg_regress (tests/regress/sql/hostile.sql).
//!
//! `leases`: grants, renewals, releases, tokens, the key lock, settings, retries, fence.stats;
//! `writes`: fenced writes and optimistic concurrency; `fast`: fast leases beside durable ones.
//! The helpers they share are here.
use pgrx::prelude::*;

mod fast;
mod leases;
mod writes;

pub fn one<T: IntoDatum + FromDatum>(sql: &str) -> Option<T> {
    Spi::get_one::<T>(sql).expect("query failed")
}

pub fn run(sql: &str) {
    Spi::run(sql).expect("statement failed")
}

/// Acquires `key` and remembers the token in a session variable (see `token`).
pub fn acquire(key: &str, ttl: &str) -> Option<i64> {
    acquire_kind(key, ttl, true)
}

/// The same, durable or fast.
pub fn acquire_kind(key: &str, ttl: &str, durable: bool) -> Option<i64> {
    let sql = format!(
        "SELECT (l).fence FROM (SELECT fence.lease_acquire('{key}', '{ttl}', durable => {durable}) AS l) a,
                LATERAL (SELECT set_config('{}', (l).token::text, true)) t",
        token_variable(key)
    );
    one::<i64>(&sql)
}

pub fn token(key: &str) -> String {
    format!("current_setting('{}')::uuid", token_variable(key))
}

pub fn token_variable(key: &str) -> String {
    format!("test.token_{}", key.replace(|c: char| !c.is_ascii_alphanumeric(), "_"))
}

/// A grant that must succeed: its fence.
pub fn granted(key: &str, ttl: &str) -> i64 {
    acquire(key, ttl).unwrap_or_else(|| panic!("{key} was not granted"))
}

pub fn current_fence(key: &str) -> Option<i64> {
    one::<i64>(&format!("SELECT fence.current_fence('{key}')"))
}

/// The server's clock in microseconds since 1970, the scale of fences.
pub fn clock_us() -> i64 {
    one::<i64>("SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint").unwrap()
}

/// 'ok', or the SQLSTATE and message of the error `sql` raises. The error is caught in a
/// PL/pgSQL block, whose subtransaction leaves the test's transaction usable; and its message,
/// which quotes a fence known only at run time, can be compared exactly (`error =` cannot).
pub fn outcome_of(sql: &str) -> String {
    run("CREATE OR REPLACE FUNCTION pg_temp.outcome_of(sql text) RETURNS text LANGUAGE plpgsql AS $f$
         BEGIN
             EXECUTE sql;
             RETURN 'ok';
         EXCEPTION WHEN OTHERS THEN
             RETURN SQLSTATE || ': ' || SQLERRM;
         END $f$");
    one::<String>(&format!("SELECT pg_temp.outcome_of($sql${sql}$sql$)")).unwrap()
}
