-- pg_fence 0.2.0 -> 0.3.0:
-- - fence.fence_holds, the core of fence_guard and fenced_update, is no longer SECURITY DEFINER and
--   has no search_path of its own: it now reads the lease row from its index without running a
--   statement (src/lease_row.rs), so it needs no privileges and resolves no names. That setting's
--   save and restore were most of the guard's cost per call.
\echo Use "ALTER EXTENSION pg_fence UPDATE TO '0.3.0'" to load this file. \quit

ALTER FUNCTION fence.fence_holds(text, bigint) SECURITY INVOKER RESET ALL;
