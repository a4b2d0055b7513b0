//! #[pg_test]s of grants, renewals, releases, tokens, the key lock, settings, retries and fence.stats.
use pgrx::prelude::*;

#[pg_schema]
mod tests {
    use crate::pg_tests::*;

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
