-- Hot key, pg_fence: every client queues for the same key (wait), holds it for one round trip, and
-- releases it. A wait that ran out (NULL lease) would release a random token, which returns false.
SELECT coalesce((SELECT token FROM fence.lease_acquire('hot', '30 seconds', wait => '30 seconds')), gen_random_uuid()) AS tok \gset
SELECT fence.lease_release('hot', :tok);
