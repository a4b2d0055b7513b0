-- First of all, before anything is made: sql/privileges.sql makes roles fence_user and fence_admin
-- when missing (and fence_admin a member of fence_user), which an installer without CREATEROLE may
-- not do (a plain role with CREATE on the database, or pg_tle's pgtle_admin alone, as on a managed
-- service). Such an installer is told what to have done first, by a role that may (the service's
-- administrator). Roles of those names that exist are used as they are (sql/privileges.sql), so
-- that is the way to install without CREATEROLE:
--     CREATE ROLE fence_user NOLOGIN;
--     CREATE ROLE fence_admin NOLOGIN IN ROLE fence_user;
-- then the install, then GRANT fence_user (or fence_admin) TO each application role.
DO $$
DECLARE
    can_create boolean := (SELECT r.rolsuper OR r.rolcreaterole FROM pg_catalog.pg_roles r
                            WHERE r.rolname = CURRENT_USER);
    missing text := (SELECT pg_catalog.string_agg(want, ' and ' ORDER BY want)
                       FROM pg_catalog.unnest(ARRAY['fence_admin', 'fence_user']) want
                      WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = want));
BEGIN
    IF missing IS NOT NULL AND NOT can_create THEN
        RAISE EXCEPTION 'pg_fence needs roles fence_user and fence_admin, and % may not create %', CURRENT_USER, missing
            USING ERRCODE = '42501',
                  HINT = 'Have a role with CREATEROLE run "CREATE ROLE fence_user NOLOGIN; CREATE ROLE fence_admin NOLOGIN IN ROLE fence_user;", then install again.';
    END IF;
    IF missing IS NULL AND NOT can_create
       AND NOT pg_catalog.pg_has_role('fence_admin', 'fence_user', 'MEMBER')
       AND NOT pg_catalog.pg_has_role(CURRENT_USER, 'fence_user', 'USAGE WITH ADMIN OPTION') THEN
        RAISE EXCEPTION 'fence_admin must be a member of fence_user, and % may not make it one', CURRENT_USER
            USING ERRCODE = '42501',
                  HINT = 'Have a role with CREATEROLE run "GRANT fence_user TO fence_admin;", then install again.';
    END IF;
END
$$;
