-- Fenced writes: one-line SQL functions over the Rust cores in src/fencing.rs (see sql/leases.sql
-- for why), raising pg_fence's stale-fence error PF002. They run with the caller's privileges, so
-- table grants and row-level security apply to the writes as to any UPDATE the caller makes; only
-- the cores that read the lease table are SECURITY DEFINER.

CREATE FUNCTION fence.raise_stale_fence(key text, fence bigint, result anyelement)
RETURNS anyelement
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'fence % is stale for key "%"', fence, key
        USING ERRCODE = 'PF002',
              DETAIL = 'The key''s live lease has another fence, or no lease on it is live.',
              HINT = 'Another holder took over, or the lease expired: stop writing, and acquire the key again.';
END
$$;

CREATE FUNCTION fence.fence_guard(key text, fence bigint)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$ SELECT CASE WHEN fence.fence_holds(key, fence) THEN true ELSE fence.raise_stale_fence(key, fence, true) END $$;

-- The guard runs first (CASE evaluates its condition first), then the UPDATE, as the caller.
CREATE FUNCTION fence.fenced_update(key text, fence bigint, target regclass, changes jsonb, filter jsonb)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$
    SELECT CASE WHEN fence.fence_holds(key, fence) THEN fence.update_matching(target::pg_catalog.oid, changes, filter)
                ELSE fence.raise_stale_fence(key, fence, 0::bigint) END
$$;

CREATE FUNCTION fence.raise_stale_write(target regclass, fence_column name, fence bigint, filter jsonb)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'fence % is stale for % in %', fence, filter, target
        USING ERRCODE = 'PF002',
              DETAIL = format('A row matching the filter already holds a higher %I.', fence_column),
              HINT = 'A writer with a newer fence got there first: stop, and do not retry with this fence.';
END
$$;

CREATE FUNCTION fence.fenced_write(target regclass, fence_column name, fence bigint, changes jsonb, filter jsonb)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$
    SELECT coalesce(fence.write_unless_stale(target::pg_catalog.oid, fence_column::pg_catalog.text, fence,
                                             changes, filter),
                    fence.raise_stale_write(target, fence_column, fence, filter))
$$;
