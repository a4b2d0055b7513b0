-- Administration. PostgreSQL reserves role names starting with "pg_", so the role that may revoke
-- other holders' leases is called fence_admin. It is created if missing and kept when the extension
-- is dropped (roles are cluster-wide; other databases may use it).
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'fence_admin') THEN
        CREATE ROLE fence_admin NOLOGIN;
    END IF;
END
$$;

REVOKE ALL ON FUNCTION fence.lease_revoke(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fence.lease_revoke(text) TO fence_admin;
