-- Who may call what. Nothing in schema fence is for PUBLIC but the schema's name and the figures
-- of the sweeper and of fence.stats: a role that may take leases can fill the lease table with
-- keys and hold back grants with guards, so leases are for the roles an administrator names.
--
-- - fence_user: leases, fencing, optimistic concurrency and the view fence.leases
--   (GRANT fence_user TO app_role).
-- - fence_admin: all of that, and lease_revoke and sweep, which act on other roles' leases.
--
-- PostgreSQL reserves role names starting with "pg_". The roles are created if missing and kept
-- when the extension is dropped (roles are cluster-wide; other databases may use them); a
-- pre-existing role of either name is used as it is.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'fence_user') THEN
        CREATE ROLE fence_user NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'fence_admin') THEN
        CREATE ROLE fence_admin NOLOGIN;
    END IF;
    IF NOT pg_catalog.pg_has_role('fence_admin', 'fence_user', 'MEMBER') THEN
        GRANT fence_user TO fence_admin;
    END IF;
END
$$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA fence FROM PUBLIC;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA fence TO fence_user;
REVOKE EXECUTE ON FUNCTION fence.lease_revoke(text), fence.sweep() FROM fence_user;
GRANT EXECUTE ON FUNCTION fence.lease_revoke(text), fence.sweep() TO fence_admin;

REVOKE SELECT ON fence.leases FROM PUBLIC;
GRANT SELECT ON fence.leases TO fence_user;

GRANT EXECUTE ON FUNCTION fence.stats_values() TO PUBLIC;
GRANT SELECT ON fence.stats TO PUBLIC;
REVOKE EXECUTE ON FUNCTION fence.stats_reset() FROM fence_user;
GRANT EXECUTE ON FUNCTION fence.stats_reset() TO fence_admin;
