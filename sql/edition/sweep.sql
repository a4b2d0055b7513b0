-- fence.sweep() (src/sweeper/mod.rs): marks expired leases (and those whose session ended) ended,
-- deletes the rows of leases that ended more than retain_ended ago, raising the high-water mark to
-- their fences in the same transaction, and keeps its figures. At most 1,000 rows per call, skipping
-- locked ones. A row whose ended lease still has a writer under it (a transaction holding its
-- guard lock) stays: its guard lock, taken as a grant takes it (at once or not at all), tells
-- (`writers_done`). Callable by pg_cron; grants do not need it (an expired lease is free at once).
CREATE FUNCTION fence.sweep() RETURNS bigint
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now timestamptz := clock_timestamp();
    retain interval := fence_internal.setting('retain_ended')::interval;
    swept bigint := 0;
    deleted bigint := 0;
    n bigint;
    top bigint;
BEGIN
    PERFORM fence_internal.require_writable('sweep leases');
    -- PL/pgSQL cannot ask whether it runs in a transaction block (docs/sql-edition.md); these tell
    -- one apart from a statement of its own: the transaction wrote before, began more than 10 ms
    -- before the statement (the extended query protocol's Parse starts it a little earlier), or the
    -- statement came in one query string behind BEGIN.
    IF pg_current_xact_id_if_assigned() IS NOT NULL
       OR statement_timestamp() - transaction_timestamp() > interval '10 milliseconds'
       OR current_query() ~* '^\s*(begin|start\s+transaction)\M' THEN
        RAISE EXCEPTION 'fence.sweep() cannot run inside a transaction block' USING ERRCODE = '25001',
            HINT = 'Call it on its own (autocommit), as the sweeper worker and pg_cron do: the leases it sweeps '
                   'stay locked until its transaction ends, and their next acquirers would wait for it.';
    END IF;
    PERFORM 1 FROM fence.sweeper_stats WHERE one FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    -- mark ended: expired, or their session gone
    WITH m AS (
        UPDATE fence.lease_state s
           SET token_hash = NULL, expires_at = least(s.expires_at, now), ended_hash = s.token_hash,
               ended_fence = s.fence, ended_at = least(s.expires_at, now),
               ended_reason = CASE WHEN s.expires_at > now THEN 'session_ended' ELSE 'expired' END
         WHERE (s.key, s.slot) IN (SELECT x.key, x.slot FROM fence.lease_state x
                                    WHERE x.token_hash IS NOT NULL
                                      AND NOT (x.expires_at > now AND (x.session_id IS NULL
                                               OR coalesce(fence.holder_alive(x.session_pid, x.session_id), false)))
                                    LIMIT 1000 FOR UPDATE SKIP LOCKED)
        RETURNING s.key, s.fence)
    SELECT count(*) INTO n FROM m, LATERAL fence_internal.announce('expired', m.key, m.fence);
    swept := swept + n;
    WITH m AS (
        UPDATE fence.fast_lease_state s
           SET token_hash = NULL, expires_at = least(s.expires_at, now), ended_hash = s.token_hash,
               ended_fence = s.fence, ended_at = least(s.expires_at, now),
               ended_reason = CASE WHEN s.expires_at > now THEN 'session_ended' ELSE 'expired' END
         WHERE s.key <> '' AND (s.key, s.slot) IN (SELECT x.key, x.slot FROM fence.fast_lease_state x
                                    WHERE x.key <> '' AND x.token_hash IS NOT NULL
                                      AND NOT (x.expires_at > now AND (x.session_id IS NULL
                                               OR coalesce(fence.holder_alive(x.session_pid, x.session_id), false)))
                                    LIMIT 1000 FOR UPDATE SKIP LOCKED)
        RETURNING s.key, s.fence)
    SELECT count(*) INTO n FROM m, LATERAL fence_internal.announce('expired', m.key, m.fence);
    swept := swept + n;
    -- delete the rows ended more than retain_ended ago, whose lock-delay has passed and under
    -- which no writer's transaction is open
    WITH d AS (
        DELETE FROM fence.lease_state s
         WHERE (s.key, s.slot) IN (SELECT x.key, x.slot FROM fence.lease_state x
                                    WHERE x.token_hash IS NULL AND x.expires_at <= now - retain
                                      AND x.expires_at + x.lock_delay * interval '1 microsecond' <= now
                                    LIMIT 1000 FOR UPDATE SKIP LOCKED)
           AND fence_internal.writers_done(s.key, s.shared, s.slot)
        RETURNING s.fence)
    SELECT count(*), max(fence) INTO n, top FROM d;
    deleted := deleted + n;
    IF top IS NOT NULL THEN
        INSERT INTO fence.high_water AS h (one, fence) VALUES (true, top)
        ON CONFLICT (one) DO UPDATE SET fence = greatest(h.fence, excluded.fence);
    END IF;
    WITH d AS (
        DELETE FROM fence.fast_lease_state s
         WHERE s.key <> '' AND (s.key, s.slot) IN (SELECT x.key, x.slot FROM fence.fast_lease_state x
                                    WHERE x.key <> '' AND x.token_hash IS NULL AND x.expires_at <= now - retain
                                      AND x.expires_at + x.lock_delay * interval '1 microsecond' <= now
                                    LIMIT 1000 FOR UPDATE SKIP LOCKED)
           AND fence_internal.writers_done(s.key, s.shared, s.slot)
        RETURNING s.fence)
    SELECT count(*), max(fence) INTO n, top FROM d;
    deleted := deleted + n;
    IF top IS NOT NULL THEN
        INSERT INTO fence.high_water AS h (one, fence) VALUES (true, top)
        ON CONFLICT (one) DO UPDATE SET fence = greatest(h.fence, excluded.fence);
    END IF;
    -- the fast reservation: all but the highest row
    DELETE FROM fence.fast_reserve r WHERE r.fence < (SELECT max(x.fence) FROM fence.fast_reserve x);
    UPDATE fence.sweeper_stats
       SET last_run_at = now, last_swept = swept, total_swept = total_swept + swept,
           total_deleted = total_deleted + deleted;
    PERFORM set_config('synchronous_commit', 'off', true);
    RETURN swept + deleted;
END
$$;

-- Whether no writer under the ended lease of (key, slot) still holds its guard lock: the lock,
-- tried as a grant takes it, at once, in a subtransaction rolled back to give it back.
CREATE FUNCTION fence_internal.writers_done(key text, shared boolean, slot integer) RETURNS boolean
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    BEGIN
        IF pg_try_advisory_xact_lock(fence_internal.lock_id(fence_internal.guard_lock_name(shared, slot), key)) THEN
            RAISE SQLSTATE 'PFZ02';
        END IF;
        RETURN false;
    EXCEPTION WHEN SQLSTATE 'PFZ02' THEN
        RETURN true;
    END;
END
$$;

-- The sweep of one key, done by each grant of it (the issue asks grants to sweep): the key's rows
-- other than the one just granted whose lease ended more than retain_ended ago, whose lock-delay
-- has passed and under which no writer's transaction is open, are deleted, the high-water mark
-- raised to their fences in the same transaction. (Expired rows the grant marked ended itself,
-- fence_internal.end_unreleased.) The grant holds the key's change lock: no other grant of the key runs.
CREATE FUNCTION fence_internal.sweep_key(key text, now timestamptz, granted_durable boolean, granted_slot integer)
RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    retain interval := fence_internal.setting('retain_ended')::interval;
    top bigint;
BEGIN
    WITH d AS (
        DELETE FROM fence.lease_state s
         WHERE s.key = sweep_key.key AND NOT (granted_durable AND s.slot = granted_slot)
           AND s.token_hash IS NULL AND s.expires_at <= now - retain
           AND s.expires_at + s.lock_delay * interval '1 microsecond' <= now
           AND fence_internal.writers_done(s.key, s.shared, s.slot)
        RETURNING s.fence),
    f AS (
        DELETE FROM fence.fast_lease_state s
         WHERE s.key = sweep_key.key AND NOT (NOT granted_durable AND s.slot = granted_slot)
           AND s.token_hash IS NULL AND s.expires_at <= now - retain
           AND s.expires_at + s.lock_delay * interval '1 microsecond' <= now
           AND fence_internal.writers_done(s.key, s.shared, s.slot)
        RETURNING s.fence)
    SELECT max(x.fence) INTO top FROM (SELECT fence FROM d UNION ALL SELECT fence FROM f) x;
    IF top IS NOT NULL THEN
        INSERT INTO fence.high_water AS h (one, fence) VALUES (true, top)
        ON CONFLICT (one) DO UPDATE SET fence = greatest(h.fence, excluded.fence);
    END IF;
END
$$;
