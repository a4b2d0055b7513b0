-- Hot key, pg_fence's fast leases: as hot_fence.sql, with durable => false (no WAL flush per grant).
SELECT coalesce((SELECT token FROM fence.lease_acquire('hot', '30 seconds', wait => '30 seconds', durable => false)), gen_random_uuid()) AS tok \gset
SELECT fence.lease_release('hot', :tok);
