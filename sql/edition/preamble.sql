-- The SQL edition makes schema fence itself (the extension's control file names it for CREATE
-- EXTENSION; pg_tle's extensions have no schema of their own): schema.sql then checks its owner.
CREATE SCHEMA IF NOT EXISTS fence;
