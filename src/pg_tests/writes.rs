//! #[pg_test]s of fenced writes and optimistic concurrency.
use pgrx::prelude::*;

#[pg_schema]
mod tests {
    use crate::pg_tests::*;

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
            let by_guard = crate::leases::state::rows::live(key, crate::pg::clock::now()).next();
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
}
