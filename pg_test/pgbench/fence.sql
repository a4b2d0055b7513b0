-- pg_fence: acquire a random key, then release it with the token it returned.
-- A key held by another client yields a NULL lease; a random token keeps the release valid (it returns false).
\set k random(1, 100000)
SELECT coalesce((fence.lease_acquire('k' || :k, '30 seconds')).token, gen_random_uuid()) AS tok \gset
SELECT fence.lease_release('k' || :k, :tok);
