-- await_change (src/leases/calls/observe.rs): the key's state is its live lease's (fence, owner),
-- the one with the highest fence, or (NULL, NULL). Returns at once when it differs from the state
-- passed in; otherwise looks again every 50 ms (no latch wakes it; every observe_interval when that
-- is shorter, 10 ms at least) until it differs or `timeout` runs out. It writes nothing. Paced as
-- the extension's: a session looks at a key no sooner than observe_interval (fence.settings) after
-- its last answer that told a change of that key (kept in the session's setting fence.observe_told,
-- by the key's lock id). PL/pgSQL keeps the AccessShareLock of every table it read until the
-- transaction ends: a waiting observer holds up DDL on them (DROP EXTENSION included).
CREATE FUNCTION fence.await_change(key text, seen_fence bigint, seen_owner text, timeout interval)
RETURNS TABLE (fence bigint, owner text, live boolean, acquired_at timestamptz, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    until timestamptz;
    interval_s float8 := extract(epoch FROM fence_internal.setting('observe_interval')::interval)::float8;
    pace float8 := greatest(0.01, least(0.05, interval_s));
    told jsonb := coalesce(nullif(current_setting('fence.observe_told', true), ''), '{}')::jsonb;
    id text;
    paused_until float8;
    r fence.key_row;
BEGIN
    PERFORM fence_internal.check_key(key);
    IF timeout IS NULL THEN PERFORM fence_internal.raise_null('timeout'); END IF;
    until := clock_timestamp() + fence_internal.check_duration(timeout, 'timeout',
        'Pass how long to wait for a change, such as ''30 seconds'', or ''0'' not to wait.') * interval '1 microsecond';
    -- A REPEATABLE READ snapshot would never show it a change: it waits only in READ COMMITTED.
    IF until > clock_timestamp() AND current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'await_change cannot wait in a REPEATABLE READ or SERIALIZABLE transaction'
            USING ERRCODE = '0A000', HINT = 'Call it with a timeout in a READ COMMITTED transaction (the default), ideally on its own.';
    END IF;
    id := fence_internal.lock_id('observe', key)::text;
    paused_until := (told ->> id)::float8 + interval_s;
    WHILE paused_until > extract(epoch FROM clock_timestamp()) AND clock_timestamp() < until LOOP
        PERFORM pg_sleep(least(paused_until - extract(epoch FROM clock_timestamp()),
                               extract(epoch FROM until - clock_timestamp())));
    END LOOP;
    LOOP
        r := NULL;
        SELECT * INTO r FROM fence_internal.key_rows(key, clock_timestamp()) x WHERE x.live ORDER BY x.fence DESC LIMIT 1;
        IF (r.fence, r.owner) IS DISTINCT FROM (seen_fence, seen_owner) OR clock_timestamp() >= until THEN
            fence := r.fence; owner := r.owner; live := r.fence IS NOT NULL;
            acquired_at := r.acquired_at; expires_at := r.expires_at;
            IF (r.fence, r.owner) IS DISTINCT FROM (seen_fence, seen_owner) AND interval_s > 0 THEN
                -- remembered for the pace; the entries whose pause is over are dropped
                told := (SELECT coalesce(jsonb_object_agg(e.key, e.value), '{}') FROM jsonb_each(told) e
                          WHERE (e.value #>> '{}')::float8 + interval_s > extract(epoch FROM clock_timestamp()))
                        || jsonb_build_object(id, extract(epoch FROM clock_timestamp())::float8);
                PERFORM set_config('fence.observe_told', told::text, false);
            END IF;
            RETURN NEXT;
            RETURN;
        END IF;
        PERFORM pg_sleep(greatest(0, least(pace, extract(epoch FROM least(until, r.expires_at) - clock_timestamp()) + 0.001)));
    END LOOP;
END
$$;
