-- The SQL edition's own: fence_admin changes the settings (fence.settings, sql/edition/settings.sql).
GRANT SELECT, UPDATE (value) ON fence.settings TO fence_admin;
-- The helpers of schema fence_internal (sql/edition/preamble.sql): for fence_user, whose calls of
-- the functions of schema fence that are not SECURITY DEFINER run them; not for PUBLIC.
GRANT USAGE ON SCHEMA fence_internal TO fence_user;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA fence_internal FROM PUBLIC;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA fence_internal TO fence_user;
