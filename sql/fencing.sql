-- Fenced writes. The cores (fence_holds, and fenced_update's and fenced_write's, which have no SQL
-- function of their own) are pgrx functions in src/writes/fencing.rs; the public functions below are C entry points over them that raise pg_fence's
-- stale-fence error PF002 when a core answers "no" (src/pg/own_errors.rs explains why they are not SQL
-- shells). None is SECURITY DEFINER: the writes run with the caller's privileges, so table grants and
-- row-level security apply to them as to any UPDATE the caller makes, and the guard reads the lease
-- row without needing any (src/leases/row.rs).

CREATE FUNCTION fence.fence_guard(key text, fence bigint)
RETURNS boolean
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'pg_fence_fence_guard';

-- The guard runs first, then the UPDATE, as the caller.
CREATE FUNCTION fence.fenced_update(key text, fence bigint, target regclass, changes jsonb, filter jsonb)
RETURNS bigint
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'pg_fence_fenced_update';

CREATE FUNCTION fence.fenced_write(target regclass, fence_column name, fence bigint, changes jsonb, filter jsonb)
RETURNS bigint
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'pg_fence_fenced_write';

-- The last condition of fenced_write's UPDATE (src/writes/fencing.rs): may a row holding row_fence be
-- written under fence? Its high cost makes PostgreSQL evaluate it after every other condition.
CREATE FUNCTION fence.fence_not_above(row_fence bigint, fence bigint)
RETURNS boolean
LANGUAGE c VOLATILE COST 1000000
AS 'MODULE_PATHNAME', 'fence_not_above_wrapper';
