-- The SQL edition makes schema fence itself (the extension's control file names it for CREATE
-- EXTENSION; pg_tle's extensions have no schema of their own): schema.sql then checks its owner.
CREATE SCHEMA IF NOT EXISTS fence;
-- The edition's own helpers live in schema fence_internal, so that schema fence holds the very
-- functions the extension's does (tests/regress/sql/api_surface.sql). PUBLIC may not use it: the
-- functions that call its helpers as the caller are fence_user's (sql/edition/privileges.sql).
CREATE SCHEMA IF NOT EXISTS fence_internal;
REVOKE ALL ON SCHEMA fence_internal FROM PUBLIC;
