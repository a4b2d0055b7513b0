//! #[pg_test]s of fast leases (durable => false) beside durable ones.
use pgrx::prelude::*;

#[pg_schema]
mod tests {
    use crate::pg_tests::*;

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
}
