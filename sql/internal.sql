-- The functions of schema fence that back the public ones and are not part of the API: each says
-- so in its COMMENT (\df+ fence.* shows it), may change in any release, and is not to be called.
-- They keep their names: a new library runs over an older version's SQL objects until ALTER
-- EXTENSION pg_fence UPDATE (see src/pg/installed.rs), and its statements call some of them by name.
COMMENT ON FUNCTION fence.renew_if_held(text, uuid, interval) IS
    'pg_fence internal: the core of fence.lease_renew; not part of the API';
COMMENT ON FUNCTION fence.renew_all_if_held(text[], uuid, interval) IS
    'pg_fence internal: the core of fence.lease_renew_all; not part of the API';
COMMENT ON FUNCTION fence.raise_lease_lost(text) IS
    'pg_fence internal: raises fence.lease_renew''s PF001; not part of the API';
COMMENT ON FUNCTION fence.raise_lease_lost(text, uuid) IS
    'pg_fence internal: raises fence.lease_renew''s PF001, naming the reason; not part of the API';
COMMENT ON FUNCTION fence.raise_lease_set_lost(text[], uuid) IS
    'pg_fence internal: raises fence.lease_renew_all''s PF001, naming a lost key and the reason; not part of the API';
COMMENT ON FUNCTION fence.holder_alive(integer, bigint) IS
    'pg_fence internal: whether a session-bound lease''s session is still there; not part of the API';
COMMENT ON FUNCTION fence.fast_lease_rows() IS
    'pg_fence internal: the fast leases'' rows for view fence.leases; not part of the API';
COMMENT ON FUNCTION fence.fence_holds(text, bigint) IS
    'pg_fence internal: the core of fence.fence_guard; not part of the API';
COMMENT ON FUNCTION fence.update_matching(oid, jsonb, jsonb) IS
    'pg_fence internal: the UPDATE that fence.fenced_update makes once its guard passed, without the guard; not part of the API';
COMMENT ON FUNCTION fence.fence_not_above(bigint, bigint) IS
    'pg_fence internal: the fence condition of fence.fenced_write''s UPDATE; not part of the API';
COMMENT ON FUNCTION fence.update_versioned_row(oid, text, bigint, jsonb, jsonb) IS
    'pg_fence internal: the core of fence.versioned_update; not part of the API';
COMMENT ON FUNCTION fence.checked_version(oid, bigint, bigint) IS
    'pg_fence internal: the version check of fence.versioned_update''s UPDATE; not part of the API';
COMMENT ON FUNCTION fence.check_version() IS
    'pg_fence internal: trigger of fence.enable_versioning; not part of the API';
COMMENT ON FUNCTION fence.bump_version() IS
    'pg_fence internal: trigger of fence.enable_versioning; not part of the API';
COMMENT ON FUNCTION fence.require_table(regclass) IS
    'pg_fence internal: the argument check of fence.enable_versioning; not part of the API';
COMMENT ON FUNCTION fence.stats_values() IS
    'pg_fence internal: the core of view fence.stats; not part of the API';
