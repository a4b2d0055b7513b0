-- pg_fence 0.2.0 -> 0.3.0:
-- - fence.fence_holds, the core of fence_guard and fenced_update, is no longer SECURITY DEFINER and
--   has no search_path of its own: it now reads the lease row from its index without running a
--   statement (src/lease_row.rs), so it needs no privileges and resolves no names. That setting's
--   save and restore were most of the guard's cost per call.
-- - fence_guard, fenced_update and fenced_write are C entry points instead of SQL shells, raising
--   PF002 themselves (src/own_errors.rs): PostgreSQL no longer parses a shell's body into every
--   statement that calls one. The PL/pgSQL raisers they used go.
\echo Use "ALTER EXTENSION pg_fence UPDATE TO '0.3.0'" to load this file. \quit

ALTER FUNCTION fence.fence_holds(text, bigint) SECURITY INVOKER RESET ALL;

CREATE OR REPLACE FUNCTION fence.fence_guard(key text, fence bigint)
RETURNS boolean
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'pg_fence_fence_guard';

CREATE OR REPLACE FUNCTION fence.fenced_update(key text, fence bigint, target regclass, changes jsonb, filter jsonb)
RETURNS bigint
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'pg_fence_fenced_update';

CREATE OR REPLACE FUNCTION fence.fenced_write(target regclass, fence_column name, fence bigint, changes jsonb, filter jsonb)
RETURNS bigint
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'pg_fence_fenced_write';

DROP FUNCTION fence.raise_stale_fence(text, bigint, anyelement);
DROP FUNCTION fence.raise_stale_write(regclass, name, bigint, jsonb);
