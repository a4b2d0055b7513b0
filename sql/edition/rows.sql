-- A key's rows of both lease tables (src/leases/state/rows.rs, found.rs), as the statement reading
-- them sees them committed: under READ COMMITTED, the latest committed state, as the extension
-- reads it; under REPEATABLE READ or SERIALIZABLE, the transaction's snapshot, which every call
-- that decides on them first checks is the latest (fence_internal.require_latest, sql/edition/latest.sql).
-- `live` is the rule of src/leases/state/liveness.rs.
CREATE TYPE fence.key_row AS (
    durable      boolean,
    slot         integer,
    fence        bigint,
    owner        text,
    token_hash   bytea,
    acquired_at  timestamptz,
    expires_at   timestamptz,
    session_pid  integer,
    session_id   bigint,
    shared       boolean,
    permits      integer,
    live         boolean,
    session_gone boolean,
    lock_delay   bigint,
    ended_hash   bytea,
    ended_fence  bigint,
    ended_at     timestamptz,
    ended_reason text,
    handed_to    text
);

-- (A standby cannot read the unlogged table, whose rows it never has: there it reads the durable one
-- only. PL/pgSQL, so that the other statement is never planned.)
CREATE FUNCTION fence_internal.key_rows(key text, now timestamptz) RETURNS SETOF fence.key_row
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_is_in_recovery() THEN
        RETURN QUERY
        SELECT true, r.slot, r.fence, r.owner, r.token_hash, r.acquired_at, r.expires_at,
               r.session_pid, r.session_id, r.shared, r.permits,
               (r.token_hash IS NOT NULL AND r.expires_at > now), false,  -- the primary's sessions unseen
               r.lock_delay, r.ended_hash, r.ended_fence, r.ended_at, r.ended_reason, r.handed_to
          FROM fence.lease_state r WHERE r.key = key_rows.key;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT r.durable, r.slot, r.fence, r.owner, r.token_hash, r.acquired_at, r.expires_at,
           r.session_pid, r.session_id, r.shared, r.permits,
           (r.token_hash IS NOT NULL AND r.expires_at > now AND NOT r.gone),
           r.token_hash IS NOT NULL AND r.gone,
           r.lock_delay, r.ended_hash, r.ended_fence, r.ended_at, r.ended_reason, r.handed_to
      FROM (SELECT s.*, (s.session_id IS NOT NULL
                         AND NOT coalesce(fence.holder_alive(s.session_pid, s.session_id), false)) AS gone
              FROM (SELECT true AS durable, * FROM fence.lease_state WHERE lease_state.key = key_rows.key
                    UNION ALL
                    SELECT false, * FROM fence.fast_lease_state WHERE fast_lease_state.key = key_rows.key) s) r;
END
$$;

-- Until when a lock-delay holds a grant of the key back at `now` (src/leases/state/ended.rs), or
-- NULL. A session's end not yet recorded counts from `now` (the extension counts from a waiter's
-- first sight of it), and never later than the lease's expiry.
CREATE FUNCTION fence_internal.held_back_until(rows fence.key_row[], now timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT max(e.ended + r.lock_delay * interval '1 microsecond')
      FROM unnest(rows) r,
           LATERAL (SELECT CASE WHEN r.token_hash IS NOT NULL
                                THEN CASE WHEN r.session_gone THEN least(now, r.expires_at) ELSE r.expires_at END
                                WHEN r.ended_fence = r.fence AND r.ended_reason <> 'released' THEN r.ended_at
                           END AS ended) e
     WHERE r.lock_delay > 0 AND NOT r.live AND e.ended + r.lock_delay * interval '1 microsecond' > now
$$;

-- The slots a grant in mode (shared, permits) may take among the rows, in the order it tries them
-- (src/leases/state/slots.rs): none while the live holders leave no room; a shared grant's is one.
CREATE FUNCTION fence_internal.free_slots(shared boolean, permits integer, rows fence.key_row[]) RETURNS integer[]
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    live fence.key_row[] := ARRAY(SELECT r FROM unnest(rows) r WHERE r.live);
    lim integer;
BEGIN
    IF EXISTS (SELECT FROM unnest(live) r WHERE r.shared <> free_slots.shared) THEN
        RETURN '{}';
    END IF;
    IF NOT shared THEN
        lim := least(permits, (SELECT min(r.permits) FROM unnest(live) r));
        IF cardinality(live) >= lim THEN
            RETURN '{}';
        END IF;
    END IF;
    RETURN ARRAY(SELECT s FROM generate_series(0, CASE WHEN shared THEN cardinality(live) ELSE permits - 1 END) s
                  WHERE NOT EXISTS (SELECT FROM unnest(live) r WHERE r.slot = s)
                  ORDER BY s LIMIT CASE WHEN shared THEN 1 END);
END
$$;

-- The slot a grant in mode (shared, permits) would take first, or NULL while the live holders
-- leave no room.
CREATE FUNCTION fence_internal.slot_for(shared boolean, permits integer, rows fence.key_row[]) RETURNS integer
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp
AS $$ SELECT (fence_internal.free_slots(shared, permits, rows))[1] $$;

-- The name of a slot's guard lock; shared holders have one for all.
CREATE FUNCTION fence_internal.guard_lock_name(shared boolean, slot integer) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp
AS $$ SELECT CASE WHEN shared THEN 'guard:shared' ELSE 'guard:' || slot END $$;

-- The guard locks of the key's ended holders of another mode: a grant in any slot waits for their
-- writers; sorted. (A parameter is named with the function's name wherever a column of r has its
-- name: in an SQL function the column would win.)
CREATE FUNCTION fence_internal.other_modes_locks(shared boolean, permits integer, rows fence.key_row[])
RETURNS text[]
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(array_agg(DISTINCT l ORDER BY l), '{}')
      FROM (SELECT fence_internal.guard_lock_name(r.shared, r.slot) AS l
              FROM unnest(rows) r
             WHERE NOT r.live
                   AND (r.shared, r.permits) IS DISTINCT FROM
                       (other_modes_locks.shared,
                        CASE WHEN other_modes_locks.shared THEN r.permits ELSE other_modes_locks.permits END)
                   AND NOT (r.shared AND other_modes_locks.shared)) l
$$;

-- The guard locks a grant into `slot` waits for (src/leases/state/slots.rs): the slot's own, and
-- those of every ended holder of another mode; sorted, so every grant takes them in one order.
CREATE FUNCTION fence_internal.locks_to_wait_for(shared boolean, permits integer, slot integer, rows fence.key_row[])
RETURNS text[]
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(array_agg(DISTINCT l ORDER BY l), '{}')
      FROM (SELECT unnest(fence_internal.other_modes_locks(shared, permits, rows)) AS l
            UNION ALL
            SELECT fence_internal.guard_lock_name(false, slot) WHERE NOT shared) l
$$;

-- The fast leases' rows for view fence.leases (sql/leases.sql); none on a standby.
CREATE FUNCTION fence.fast_lease_rows()
RETURNS TABLE (key text, owner text, fence bigint, acquired_at timestamptz, expires_at timestamptz,
               session_pid integer, live boolean, shared boolean, permits integer)
LANGUAGE plpgsql STABLE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_is_in_recovery() THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT f.key, f.owner, f.fence, f.acquired_at, f.expires_at, f.session_pid,
           f.token_hash IS NOT NULL AND f.expires_at > clock_timestamp()
           AND (f.session_id IS NULL OR coalesce(fence.holder_alive(f.session_pid, f.session_id), false)),
           f.shared, f.permits
      FROM fence.fast_lease_state f
     WHERE f.key <> '';
END
$$;
