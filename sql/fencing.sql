-- Fenced writes: the public functions, as SQL shells over the Rust cores in src/fencing.rs, so that
-- a stale fence is reported with pg_fence's own SQLSTATE PF002 (pgrx can raise only the codes it
-- knows; PL/pgSQL can raise any).

-- The guard reads the lease table, so it runs as the extension's owner, with a pinned search_path.
CREATE FUNCTION fence.fence_guard(key text, fence bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT fence.fence_holds(key, fence) THEN
        RAISE EXCEPTION 'fence % is stale for key "%"', fence, key
            USING ERRCODE = 'PF002',
                  DETAIL = 'The key''s live lease has another fence, or no lease on it is live.',
                  HINT = 'Another holder took over, or the lease expired: stop writing, and acquire the key again.';
    END IF;
    RETURN true;
END
$$;

REVOKE ALL ON FUNCTION fence.fence_holds(text, bigint) FROM PUBLIC;

-- The writes run with the caller's privileges (no SECURITY DEFINER, no pinned search_path), so table
-- grants and row-level security apply as to any UPDATE the caller makes.
CREATE FUNCTION fence.fenced_update(key text, fence bigint, target regclass, changes jsonb, filter jsonb)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    PERFORM fence.fence_guard(key, fence);
    RETURN fence.update_matching(target::oid, changes, filter);
END
$$;

CREATE FUNCTION fence.fenced_write(target regclass, fence_column name, fence bigint, changes jsonb, filter jsonb)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    written bigint := fence.write_unless_stale(target::oid, fence_column::text, fence, changes, filter);
BEGIN
    IF written IS NULL THEN
        -- Raising undoes the rows written above.
        RAISE EXCEPTION 'fence % is stale for % in %', fence, filter, target
            USING ERRCODE = 'PF002',
                  DETAIL = format('A row matching the filter already holds a higher %I.', fence_column),
                  HINT = 'A writer with a newer fence got there first: stop, and do not retry with this fence.';
    END IF;
    RETURN written;
END
$$;
