//! In-backend tests of each function. Each test runs inside a transaction that is rolled back;
//! commits, concurrency and crashes are tested from outside (tests/), and bad arguments by
//! pg_regress (tests/regress/sql/hostile.sql).
use pgrx::prelude::*;

#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    fn one<T: IntoDatum + FromDatum>(sql: &str) -> Option<T> {
        Spi::get_one::<T>(sql).expect("query failed")
    }

    fn run(sql: &str) {
        Spi::run(sql).expect("statement failed")
    }

    /// Acquires `key` and remembers the token in a session variable (see `token`).
    fn acquire(key: &str, ttl: &str) -> Option<i64> {
        acquire_kind(key, ttl, true)
    }

    /// The same, durable or fast.
    fn acquire_kind(key: &str, ttl: &str, durable: bool) -> Option<i64> {
        let sql = format!(
            "SELECT (l).fence FROM (SELECT fence.lease_acquire('{key}', '{ttl}', durable => {durable}) AS l) a,
                    LATERAL (SELECT set_config('{}', (l).token::text, true)) t",
            token_variable(key)
        );
        one::<i64>(&sql)
    }

    fn token(key: &str) -> String {
        format!("current_setting('{}')::uuid", token_variable(key))
    }

    fn token_variable(key: &str) -> String {
        format!("test.token_{}", key.replace(|c: char| !c.is_ascii_alphanumeric(), "_"))
    }

    /// A grant that must succeed: its fence.
    fn granted(key: &str, ttl: &str) -> i64 {
        acquire(key, ttl).unwrap_or_else(|| panic!("{key} was not granted"))
    }

    fn current_fence(key: &str) -> Option<i64> {
        one::<i64>(&format!("SELECT fence.current_fence('{key}')"))
    }

    /// The server's clock in microseconds since 1970, the scale of fences.
    fn clock_us() -> i64 {
        one::<i64>("SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint").unwrap()
    }

    /// 'ok', or the SQLSTATE and message of the error `sql` raises. The error is caught in a
    /// PL/pgSQL block, whose subtransaction leaves the test's transaction usable; and its message,
    /// which quotes a fence known only at run time, can be compared exactly (`error =` cannot).
    fn outcome_of(sql: &str) -> String {
        run("CREATE OR REPLACE FUNCTION pg_temp.outcome_of(sql text) RETURNS text LANGUAGE plpgsql AS $f$
             BEGIN
                 EXECUTE sql;
                 RETURN 'ok';
             EXCEPTION WHEN OTHERS THEN
                 RETURN SQLSTATE || ': ' || SQLERRM;
             END $f$");
        one::<String>(&format!("SELECT pg_temp.outcome_of($sql${sql}$sql$)")).unwrap()
    }

    #[pg_test]
    fn a_first_grant_gets_a_fence_no_lower_than_the_clock() {
        assert_eq!(current_fence("k"), None);
        let before = clock_us();
        let fence = granted("k", "10 s");
        assert!(fence >= before, "first fence {fence} is below the clock reading {before} before it");
        assert_eq!(current_fence("k"), Some(fence));
    }

    #[pg_test]
    fn held_key_is_refused_without_a_new_fence() {
        let fence = granted("k", "10 s");
        assert_eq!(one::<bool>("SELECT fence.lease_acquire('k', '10 s') IS NULL"), Some(true));
        assert_eq!(current_fence("k"), Some(fence));
        // The refusal issued nothing: the next grant is above the last one.
        run(&format!("SELECT fence.lease_release('k', {})", token("k")));
        let next = granted("k", "10 s");
        assert!(next > fence, "fence {next} granted after {fence}");
        assert_eq!(current_fence("k"), Some(next));
    }

    #[pg_test]
    fn release_frees_the_key_and_the_next_grant_is_higher() {
        let first = granted("k", "10 s");
        let release = format!("SELECT fence.lease_release('k', {})", token("k"));
        assert_eq!(one::<bool>(&release), Some(true));
        assert_eq!(one::<bool>(&release), Some(false), "a retried release is a no-op");
        assert_eq!(current_fence("k"), Some(first), "a release changes no fence");
        let second = granted("k", "10 s");
        assert!(second > first, "fence {second} granted after {first}");
        assert_eq!(current_fence("k"), Some(second));
    }

    #[pg_test]
    fn a_retried_release_never_touches_the_next_holder() {
        let first_fence = granted("k", "10 s");
        let first = one::<String>(&format!("SELECT {}::text", token("k"))).unwrap();
        run(&format!("SELECT fence.lease_release('k', {})", token("k")));
        assert!(granted("k", "10 s") > first_fence);
        let stale = format!("SELECT fence.lease_release('k', '{first}')");
        assert_eq!(one::<bool>(&stale), Some(false));
        assert_eq!(one::<bool>("SELECT live FROM fence.leases WHERE key = 'k'"), Some(true));
    }

    #[pg_test]
    fn different_keys_have_independent_fences() {
        let a = granted("a", "10 s");
        let b = granted("b", "10 s");
        run(&format!("SELECT fence.lease_release('a', {})", token("a")));
        let a_again = granted("a", "10 s");
        assert!(a_again > a, "fence {a_again} granted after {a}");
        assert_eq!(current_fence("a"), Some(a_again));
        assert_eq!(current_fence("b"), Some(b), "a grant of another key changed this key's fence");
    }

    #[pg_test]
    fn renew_moves_expiry_forward_from_now() {
        granted("renewed", "1 s");
        let renewed = format!(
            "SELECT fence.lease_renew('renewed', {}, '1 hour') > clock_timestamp() + interval '59 minutes'",
            token("renewed")
        );
        assert_eq!(one::<bool>(&renewed), Some(true));
        assert_eq!(
            one::<bool>("SELECT expires_at > clock_timestamp() + interval '59 minutes' FROM fence.leases WHERE key = 'renewed'"),
            Some(true)
        );
    }

    #[pg_test]
    fn an_expired_lease_is_free_at_once_and_never_revived() {
        let expired = granted("k", "20 ms");
        let old = one::<String>(&format!("SELECT {}::text", token("k"))).unwrap();
        run("SELECT pg_sleep(0.05)");
        assert_eq!(one::<bool>("SELECT live FROM fence.leases WHERE key = 'k'"), Some(false));
        let release = format!("SELECT fence.lease_release('k', '{old}')");
        assert_eq!(one::<bool>(&release), Some(false), "an expired lease cannot be released");
        let next = granted("k", "10 s");
        assert!(next > expired, "fence {next} granted after {expired}");
        let acquired_after_expiry =
            "SELECT acquired_at >= clock_timestamp() - interval '1 s' FROM fence.leases";
        assert_eq!(one::<bool>(acquired_after_expiry), Some(true));
    }

    #[pg_test(error = "lease on key \"k\" is lost")]
    fn renew_after_expiry_is_lease_lost_even_when_nobody_took_over() {
        granted("k", "20 ms");
        run("SELECT pg_sleep(0.05)");
        run(&format!("SELECT fence.lease_renew('k', {}, '10 s')", token("k")));
    }

    #[pg_test]
    fn owner_defaults_to_application_name_then_pid() {
        run("SET LOCAL application_name = 'billing-worker'");
        acquire("a", "10 s");
        assert_eq!(
            one::<String>("SELECT owner FROM fence.leases WHERE key = 'a'").as_deref(),
            Some("billing-worker")
        );
        run("SET LOCAL application_name = ''");
        acquire("b", "10 s");
        let pid_owner = "SELECT owner = 'pid:' || pg_backend_pid() FROM fence.leases WHERE key = 'b'";
        assert_eq!(one::<bool>(pid_owner), Some(true));
        run("SELECT fence.lease_acquire('c', '10 s', 'host-7')");
        assert_eq!(
            one::<String>("SELECT owner FROM fence.leases WHERE key = 'c'").as_deref(),
            Some("host-7")
        );
    }

    #[pg_test]
    fn the_view_never_shows_tokens() {
        let columns = "SELECT string_agg(attname, ',' ORDER BY attnum) FROM pg_attribute
                        WHERE attrelid = 'fence.leases'::regclass AND attnum > 0";
        assert_eq!(
            one::<String>(columns).as_deref(),
            Some("key,owner,fence,acquired_at,expires_at,session_pid,live,durable,shared,permits")
        );
    }

    // That grants and renewals commit durably is checked from outside, by whether their commits
    // were flushed: tests/tests/commits.rs.

    #[pg_test(error = "cannot acquire a lease in a read-only transaction")]
    fn acquire_in_a_read_only_transaction() {
        run("SET LOCAL transaction_read_only = on");
        run("SELECT fence.lease_acquire('k', '10 s')");
    }

    #[pg_test]
    fn the_key_lock_is_an_advisory_lock_of_its_own_class() {
        acquire("k", "10 s");
        let ours = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 28774
                       AND pid = pg_backend_pid() AND mode = 'ExclusiveLock'";
        assert_eq!(one::<i64>(ours), Some(1));
    }

    #[pg_test]
    fn max_ttl_can_be_raised() {
        run("SET LOCAL pg_fence.max_ttl = '2d'");
        assert!(acquire("k", "36 hours").is_some());
    }

    #[pg_test(error = "ttl 01:00:01 exceeds pg_fence.max_ttl (3600 s)")]
    fn max_ttl_can_be_lowered() {
        run("SET LOCAL pg_fence.max_ttl = '1h'");
        acquire("k", "1 hour 1 second");
    }

    #[pg_test]
    fn tokens_are_stored_only_as_hashes() {
        let token = one::<String>("SELECT (fence.lease_acquire('k', '10 s')).token::text").unwrap();
        let stored = format!(
            "SELECT token_hash = sha256(uuid_send('{token}'::uuid)) FROM fence.lease_state WHERE key = 'k'"
        );
        assert_eq!(one::<bool>(&stored), Some(true));
        let columns = "SELECT count(*) FROM pg_attribute WHERE attrelid = 'fence.lease_state'::regclass
                          AND atttypid = 'uuid'::regtype AND NOT attisdropped";
        assert_eq!(one::<i64>(columns), Some(0), "no uuid column may hold a token");
    }

    #[pg_test]
    fn the_lease_table_is_closed_to_public() {
        let grants = "SELECT has_table_privilege('public', 'fence.lease_state', 'SELECT')
                          OR has_table_privilege('public', 'fence.lease_state', 'INSERT')
                          OR has_table_privilege('public', 'fence.lease_state', 'UPDATE')";
        assert_eq!(one::<bool>(grants), Some(false));
    }

    // Fenced writes and optimistic concurrency.

    fn invoices() {
        run(
            "CREATE TABLE invoices (id int PRIMARY KEY, status text, fence bigint, version bigint DEFAULT 1)",
        );
        run("INSERT INTO invoices VALUES (42, 'open', NULL, 1)");
    }

    #[pg_test]
    fn fence_guard_accepts_the_live_fence_and_holds_the_key_for_writers() {
        let fence = granted("invoice:42", "10 s");
        assert_eq!(one::<bool>(&format!("SELECT fence.fence_guard('invoice:42', {fence})")), Some(true));
        let guard_lock = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 28774
                             AND pid = pg_backend_pid() AND mode = 'RowShareLock'";
        assert_eq!(one::<i64>(guard_lock), Some(1));
    }

    /// The guard decides liveness in Rust (src/leases/row.rs); it must agree with live_at!, which
    /// the view's `live` column spells out, on every kind of row.
    #[pg_test]
    fn the_guard_judges_liveness_as_the_view_does() {
        acquire("plain", "1 h");
        one::<i64>("SELECT (fence.lease_acquire('bound', '1 h', session_bound => true)).fence");
        run("INSERT INTO fence.lease_state VALUES
               ('expired',  5, 'o', '\\x00', now(), clock_timestamp() - interval '1 h', NULL, NULL),
               ('released', 5, 'o', NULL,    now(), clock_timestamp() + interval '1 h', NULL, NULL),
               ('gone',     5, 'o', '\\x00', now(), clock_timestamp() + interval '1 h', pg_backend_pid(), 12345),
               ('half-set', 5, 'o', '\\x00', now(), clock_timestamp() + interval '1 h', NULL, 12345),
               ('pid-only', 5, 'o', '\\x00', now(), clock_timestamp() + interval '1 h', pg_backend_pid(), NULL)");
        let live = ["plain", "bound", "pid-only"];
        for key in ["plain", "bound", "expired", "released", "gone", "half-set", "pid-only", "absent"] {
            let by_view = |column: &str| {
                one::<i64>(&format!(
                    "SELECT (SELECT {column} FROM fence.leases WHERE key = '{key}' AND live)"
                ))
            };
            // expires_at as PostgreSQL stores it: microseconds since 2000-01-01 UTC.
            let expires_at = "(extract(epoch FROM expires_at - '2000-01-01 UTC') * 1000000)::bigint";
            let by_guard = crate::leases::row::live(key, crate::pg::clock::now()).next();
            assert_eq!(by_guard.as_ref().map(|l| l.fence), by_view("fence"), "key {key}");
            assert_eq!(by_guard.as_ref().map(|l| l.expires_at), by_view(expires_at), "key {key}");
            assert_eq!(by_guard.is_some(), live.contains(&key), "key {key}");
        }
    }

    #[pg_test]
    fn fence_guard_refuses_another_fence() {
        let fence = granted("invoice:42", "10 s");
        for other in [fence + 1, fence - 1] {
            assert_eq!(
                outcome_of(&format!("SELECT fence.fence_guard('invoice:42', {other})")),
                format!("PF002: fence {other} is stale for key \"invoice:42\"")
            );
        }
    }

    #[pg_test]
    fn fence_guard_refuses_an_expired_lease() {
        let fence = granted("invoice:42", "20 ms");
        run("SELECT pg_sleep(0.05)");
        assert_eq!(
            outcome_of(&format!("SELECT fence.fence_guard('invoice:42', {fence})")),
            format!("PF002: fence {fence} is stale for key \"invoice:42\"")
        );
    }

    #[pg_test]
    fn fenced_update_converts_values_like_jsonb_populate_record() {
        invoices();
        let fence = granted("invoice:42", "10 s");
        let updated = format!("SELECT fence.fenced_update('invoice:42', {fence}, 'invoices', '{{\"status\": \"paid\", \"version\": \"7\"}}', '{{\"id\": \"42\"}}')");
        assert_eq!(one::<i64>(&updated), Some(1));
        assert_eq!(one::<String>("SELECT status || version FROM invoices").as_deref(), Some("paid7"));
    }

    /// A table with a column of every kind of type that the writes convert in Rust (src/writes/row_update.rs)
    /// or leave to jsonb_to_record.
    fn kinds() {
        run("CREATE DOMAIN positive AS int CHECK (VALUE > 0)");
        run("CREATE DOMAIN required AS text NOT NULL");
        run("CREATE TYPE pair AS (a int, b text)");
        run("CREATE TABLE kinds (id int PRIMARY KEY, code varchar(5) UNIQUE, n numeric, big numeric,
                                 short varchar(5), fixed char(3), flag boolean, at timestamptz, span int4range,
                                 ids int[], doc jsonb, raw json, note text, number_note text, p positive,
                                 r required DEFAULT 'r', two pair, bits bit(8), tag char(3) UNIQUE)");
        run("INSERT INTO kinds (id, code, tag) VALUES (1, 'one', 'a'), (2, 'two', 'abc')");
    }

    #[pg_test]
    fn fenced_writes_convert_every_kind_of_value_as_jsonb_populate_record_does() {
        kinds();
        let changes = r#"'{"n": 1.50, "big": 123456789012345678901234567890.000, "short": "abc", "fixed": "xyz",
                           "flag": true, "at": "2026-01-01 12:00:00+00", "span": "[1,5)", "ids": [1, 2],
                           "doc": {"x": [1, 2]}, "raw": "text", "note": {"k": [1, 2]}, "number_note": 1e3,
                           "p": "7", "r": "set", "two": {"a": 1, "b": "x"}, "bits": "10101010"}'::jsonb"#;
        let updated =
            format!("SELECT fence.update_matching('kinds'::regclass, {changes}, '{{\"code\": \"two\"}}')");
        assert_eq!(one::<i64>(&updated), Some(1));
        let expected = format!("SELECT jsonb_populate_record(k, {changes})::text FROM kinds k WHERE id = 2");
        let expected = one::<String>(&expected).unwrap();
        let telling = ["1.50", "\"{\"\"k\"\": [1, 2]}\"", "xyz", "10101010"];
        assert!(telling.iter().all(|t| expected.contains(t)), "{expected}");
        let written = one::<String>("SELECT k::text FROM kinds k WHERE id = 2").unwrap();
        assert_eq!(written, expected);
        let untouched = one::<String>("SELECT k::text FROM kinds k WHERE id = 1").unwrap();
        assert_eq!(untouched, "(1,one,,,,,,,,,,,,,,r,,,\"a  \")");
    }

    /// A migration may replace a column's type by a new one of the same name: the statement's text
    /// stays the same, its parameter's type does not, and the plan kept for the old type must not
    /// be used.
    #[pg_test]
    fn fenced_writes_follow_a_column_type_made_anew_under_the_same_name() {
        run("CREATE TYPE mood AS ENUM ('ok', 'bad')");
        run("CREATE TABLE moods (id int PRIMARY KEY, m mood)");
        run("INSERT INTO moods VALUES (1, 'ok')");
        let write = |m: &str| {
            one::<i64>(&format!(
                "SELECT fence.update_matching('moods'::regclass, '{{\"m\": \"{m}\"}}', '{{\"id\": 1}}')"
            ))
        };
        assert_eq!(write("bad"), Some(1));
        run("ALTER TYPE mood RENAME TO mood_old");
        run("CREATE TYPE mood AS ENUM ('ok', 'bad', 'worse')");
        run("ALTER TABLE moods ALTER m TYPE mood USING m::text::mood");
        run("DROP TYPE mood_old");
        assert_eq!(write("worse"), Some(1));
        assert_eq!(one::<String>("SELECT m::text FROM moods").as_deref(), Some("worse"));
    }

    /// char(n) ignores trailing blanks when comparing: a filter value cut short would match another
    /// row. Likewise bit(n) must keep its length.
    #[pg_test]
    fn fenced_writes_filter_on_char_and_bit_columns_by_their_full_value() {
        kinds();
        run("UPDATE kinds SET bits = B'11110000' WHERE id = 1");
        run("UPDATE kinds SET bits = B'11111111' WHERE id = 2");
        let by_tag =
            "SELECT fence.update_matching('kinds'::regclass, '{\"note\": \"tag\"}', '{\"tag\": \"abc\"}')";
        assert_eq!(one::<i64>(by_tag), Some(1));
        let by_bits = "SELECT fence.update_matching('kinds'::regclass, '{\"note\": \"bits\"}', '{\"bits\": \"11110000\"}')";
        assert_eq!(one::<i64>(by_bits), Some(1));
        let notes = one::<String>("SELECT string_agg(id || ':' || note, ',' ORDER BY id) FROM kinds");
        assert_eq!(notes.as_deref(), Some("1:bits,2:tag"));
    }

    /// Two grants of a key, the second one's fence above the first one's.
    fn two_grants(key: &str) -> (i64, i64) {
        let first = granted(key, "10 s");
        run(&format!("SELECT fence.lease_release('{key}', {})", token(key)));
        let second = granted(key, "10 s");
        assert!(second > first, "fence {second} granted after {first}");
        (first, second)
    }

    fn fenced_write(fence: i64) -> String {
        format!("SELECT fence.fenced_write('invoices', 'fence', {fence}, '{{\"status\": \"w{fence}\"}}', '{{\"id\": 42}}')")
    }

    #[pg_test]
    fn fenced_write_keeps_the_highest_fence() {
        invoices();
        let (first, second) = two_grants("invoice:42");
        assert_eq!(one::<i64>(&fenced_write(first)), Some(1));
        assert_eq!(one::<i64>(&fenced_write(second)), Some(1));
        assert_eq!(one::<String>("SELECT status || fence FROM invoices"), Some(format!("w{second}{second}")));
    }

    #[pg_test]
    fn fenced_write_refuses_a_lower_fence() {
        invoices();
        let (first, second) = two_grants("invoice:42");
        assert_eq!(one::<i64>(&fenced_write(second)), Some(1));
        assert_eq!(
            outcome_of(&fenced_write(first)),
            format!("PF002: fence {first} is stale for {{\"id\": 42}} in public.invoices")
        );
        assert_eq!(one::<String>("SELECT status || fence FROM invoices"), Some(format!("w{second}{second}")));
    }

    #[pg_test]
    fn versioned_update_returns_the_next_version() {
        invoices();
        let update =
            "SELECT fence.versioned_update('invoices', 'version', 1, '{\"status\": \"v2\"}', '{\"id\": 42}')";
        assert_eq!(one::<i64>(update), Some(2));
    }

    #[pg_test]
    fn revoke_ends_the_live_lease_and_stales_its_fence() {
        let revoked = granted("k", "1 minute");
        assert_eq!(one::<bool>("SELECT fence.lease_revoke('k')"), Some(true));
        assert_eq!(one::<bool>("SELECT fence.lease_revoke('k')"), Some(false), "nothing left to revoke");
        assert_eq!(
            one::<bool>(&format!("SELECT fence.renew_if_held('k', {}, '1 s') IS NULL", token("k"))),
            Some(true)
        );
        assert_eq!(
            outcome_of(&format!("SELECT fence.fence_guard('k', {revoked})")),
            format!("PF002: fence {revoked} is stale for key \"k\"")
        );
        let next = granted("k", "1 minute");
        assert!(next > revoked, "fence {next} granted after the revoked {revoked}");
    }

    #[pg_test]
    fn revoke_is_for_fence_admin_only() {
        let public = "SELECT has_function_privilege('public', 'fence.lease_revoke(text)', 'EXECUTE')";
        assert_eq!(one::<bool>(public), Some(false));
        let admin = "SELECT has_function_privilege('fence_admin', 'fence.lease_revoke(text)', 'EXECUTE')";
        assert_eq!(one::<bool>(admin), Some(true));
    }

    #[pg_test]
    fn sweep_is_for_fence_admin_only() {
        let public = "SELECT has_function_privilege('fence_user', 'fence.sweep()', 'EXECUTE')";
        assert_eq!(one::<bool>(public), Some(false));
        let admin = "SELECT has_function_privilege('fence_admin', 'fence.sweep()', 'EXECUTE')";
        assert_eq!(one::<bool>(admin), Some(true));
    }

    // #[pg_test]s run inside a transaction block, where sweep() refuses to run (tests/tests/sweeper.rs
    // sweeps from a client).
    #[pg_test(error = "fence.sweep() cannot run inside a transaction block")]
    fn sweep_refuses_a_transaction_block() {
        run("SELECT fence.sweep()");
    }

    // Fast leases (durable => false): one key namespace and one fence sequence with durable ones.

    fn acquire_fast(key: &str, ttl: &str) -> Option<i64> {
        acquire_kind(key, ttl, false)
    }

    fn release(key: &str) -> bool {
        one::<bool>(&format!("SELECT fence.lease_release('{key}', {})", token(key))).unwrap()
    }

    #[pg_test]
    fn a_key_has_one_live_lease_of_either_kind_and_one_fence_sequence() {
        let fast = acquire_fast("fast", "10 s").expect("fast grant");
        let refused = |durable: bool| {
            let sql = format!("SELECT fence.lease_acquire('fast', '10 s', durable => {durable}) IS NULL");
            one::<bool>(&sql) == Some(true)
        };
        assert!(refused(true), "a durable grant over a live fast lease");
        assert!(refused(false), "a fast grant over a live fast lease");
        assert!(release("fast"));
        let durable = granted("fast", "10 s");
        assert!(durable > fast, "durable fence {durable} after fast fence {fast}");
        assert!(refused(false), "a fast grant over a live durable lease");
        assert!(release("fast"));
        let fast_again = acquire_fast("fast", "10 s").expect("fast grant");
        assert!(fast_again > durable, "fast fence {fast_again} after durable fence {durable}");
        assert_eq!(current_fence("fast"), Some(fast_again));
    }

    #[pg_test]
    fn a_fast_lease_renews_guards_shows_and_releases_like_a_durable_one() {
        let fence = acquire_fast("fast", "1 s").unwrap();
        let renewed = format!(
            "SELECT fence.lease_renew('fast', {}, '1 hour') > clock_timestamp() + interval '59 minutes'",
            token("fast")
        );
        assert_eq!(one::<bool>(&renewed), Some(true));
        assert_eq!(one::<bool>(&format!("SELECT fence.fence_guard('fast', {fence})")), Some(true));
        let shown =
            "SELECT (live AND NOT durable)::text || ' ' || fence FROM fence.leases WHERE key = 'fast'";
        assert_eq!(one::<String>(shown), Some(format!("true {fence}")));
        assert_eq!(one::<i64>("SELECT count(*) FROM fence.lease_state WHERE key = 'fast'"), Some(0));
        assert!(release("fast"));
        assert!(!release("fast"), "a retried release is a no-op");
        let stale = format!("PF002: fence {fence} is stale for key \"fast\"");
        assert_eq!(outcome_of(&format!("SELECT fence.fence_guard('fast', {fence})")), stale);
        assert_eq!(one::<bool>("SELECT live FROM fence.leases WHERE key = 'fast'"), Some(false));
    }

    /// A fence can run ahead of the clock (after a step back, or many grants in one microsecond):
    /// the next grant of the other kind still starts above it.
    #[pg_test]
    fn a_grant_starts_above_the_other_kinds_fence_ahead_of_the_clock() {
        let ahead = clock_us() + 3_600_000_000;
        run(&format!(
            "INSERT INTO fence.fast_lease_state (key, fence, owner, acquired_at, expires_at)
             VALUES ('ahead', {ahead}, 'x', now(), now())"
        ));
        assert_eq!(granted("ahead", "10 s"), ahead + 1);
        run(&format!(
            "INSERT INTO fence.lease_state (key, fence, owner, acquired_at, expires_at)
             VALUES ('ahead-durable', {ahead}, 'x', now(), now())"
        ));
        assert_eq!(acquire_fast("ahead-durable", "10 s"), Some(ahead + 1));
    }

    #[pg_test]
    fn revoke_ends_a_fast_lease() {
        let fence = acquire_fast("fast", "1 hour").unwrap();
        assert_eq!(one::<bool>("SELECT fence.lease_revoke('fast')"), Some(true));
        let stale = format!("PF002: fence {fence} is stale for key \"fast\"");
        assert_eq!(outcome_of(&format!("SELECT fence.fence_guard('fast', {fence})")), stale);
        assert!(acquire("fast", "1 s").unwrap() > fence);
    }

    #[pg_test]
    fn the_fast_lease_table_is_unlogged_and_closed_to_public() {
        let unlogged =
            "SELECT relpersistence = 'u' FROM pg_class WHERE oid = 'fence.fast_lease_state'::regclass";
        assert_eq!(one::<bool>(unlogged), Some(true));
        let grants = "SELECT has_table_privilege('public', 'fence.fast_lease_state', 'SELECT')
                          OR has_table_privilege('public', 'fence.fast_lease_state', 'UPDATE')";
        assert_eq!(one::<bool>(grants), Some(false));
    }

    // The caller's own token: a retried acquire returns the lease it granted.

    fn acquire_with_token(key: &str, token: &str, ttl: &str) -> Option<String> {
        one::<String>(&format!(
            "SELECT (SELECT l::text FROM fence.lease_acquire('{key}', '{ttl}', token => '{token}') l
                      WHERE l.fence IS NOT NULL)"
        ))
    }

    #[pg_test]
    fn a_retried_acquire_with_its_token_returns_the_same_lease() {
        let token = "6f0c7d1e-2b1a-4c3d-9e8f-0a1b2c3d4e5f";
        let first = acquire_with_token("idem", token, "1 hour").expect("granted");
        assert!(first.contains(token), "the lease holds the caller's token: {first}");
        assert_eq!(acquire_with_token("idem", token, "5 seconds"), Some(first.clone()), "expiry unchanged");
        let other = "0b8e6a52-7f0e-4d8c-8a8e-3c1d2e4f5a6b";
        assert_eq!(acquire_with_token("idem", other, "1 hour"), None, "another token is refused");
        let renew = format!("SELECT fence.lease_release('idem', '{token}')");
        assert_eq!(one::<bool>(&renew), Some(true), "the caller's token releases it");
        let again = acquire_with_token("idem", token, "1 hour").expect("granted again");
        assert_ne!(again, first, "a new grant with the same token is a new lease");
    }

    // fence.stats, without preload (as `cargo pgrx test` runs): not kept, and it says so.

    #[pg_test]
    fn stats_without_preload_are_unavailable_not_zero() {
        run("SELECT fence.lease_acquire('counted', '10 s')");
        let row =
            "SELECT format('%s %s %s', available, since IS NULL, grants_durable IS NULL) FROM fence.stats";
        assert_eq!(one::<String>(row), Some("f t t".into()));
        assert_eq!(one::<bool>("SELECT fence.stats_reset()"), Some(false));
    }
}
