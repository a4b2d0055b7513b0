-- await_change (src/leases/calls/observe.rs): the key's state is its live lease's (fence, owner),
-- the one with the highest fence, or (NULL, NULL). Returns at once when it differs from the state
-- passed in; otherwise looks again every fence.settings observe_interval (50 ms by default, 10 ms
-- at least: no latch wakes it) until it differs or `timeout` runs out. It writes nothing and
-- takes no lock.
CREATE FUNCTION fence.await_change(key text, seen_fence bigint, seen_owner text, timeout interval)
RETURNS TABLE (fence bigint, owner text, live boolean, acquired_at timestamptz, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    until timestamptz;
    pace float8 := greatest(0.01, extract(epoch FROM fence.setting('observe_interval')::interval)::float8);
    r fence.key_row;
BEGIN
    PERFORM fence.check_key(key);
    IF timeout IS NULL THEN PERFORM fence.raise_null('timeout'); END IF;
    until := clock_timestamp() + fence.check_duration(timeout, 'timeout',
        'Pass how long to wait for a change, such as ''30 seconds'', or ''0'' not to wait.') * interval '1 microsecond';
    LOOP
        r := NULL;
        SELECT * INTO r FROM fence.key_rows(key, clock_timestamp()) x WHERE x.live ORDER BY x.fence DESC LIMIT 1;
        IF (r.fence, r.owner) IS DISTINCT FROM (seen_fence, seen_owner) OR clock_timestamp() >= until THEN
            fence := r.fence; owner := r.owner; live := r.fence IS NOT NULL;
            acquired_at := r.acquired_at; expires_at := r.expires_at;
            RETURN NEXT;
            RETURN;
        END IF;
        PERFORM pg_sleep(greatest(0, least(pace, extract(epoch FROM least(until, r.expires_at) - clock_timestamp()) + 0.001)));
    END LOOP;
END
$$;
