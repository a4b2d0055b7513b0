-- Lease sets (src/leases/calls/sets.rs): every key or none, one token, in the keys' byte order.
-- All the grants run in one subtransaction, rolled back whole when one key cannot be granted.
CREATE FUNCTION fence_internal.try_grant_all(keys text[], ttl bigint, owner text, session_bound boolean, durable boolean,
                                    token uuid, mind_waiters boolean)
RETURNS SETOF fence.lease
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    each text;
    lease fence.lease;
    granted fence.lease[] := '{}';
BEGIN
    BEGIN
        FOREACH each IN ARRAY keys LOOP
            lease := fence_internal.try_grant(each, ttl, owner, session_bound, durable, token, false, 1, 0, NULL, NULL, mind_waiters);
            IF lease IS NULL THEN
                RAISE SQLSTATE 'PFZ01';
            END IF;
            granted := granted || lease;
        END LOOP;
    EXCEPTION WHEN SQLSTATE 'PFZ01' THEN
        RETURN;
    END;
    RETURN QUERY SELECT * FROM unnest(granted);
END
$$;

CREATE FUNCTION fence.lease_acquire_all(keys text[], ttl interval, owner text DEFAULT NULL, wait interval DEFAULT '0',
                                        session_bound boolean DEFAULT false, durable boolean DEFAULT true)
RETURNS SETOF fence.lease
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    sorted text[] := fence_internal.check_keys(keys, 64,
        'Pass an array of 1 to 64 distinct, non-empty keys, such as ARRAY[''invoice:1'', ''invoice:2''].', true);
    ttl_us bigint := fence_internal.check_ttl(ttl);
    who text := fence_internal.check_owner(owner);
    wait_us bigint := fence_internal.check_wait(wait);
    token uuid := gen_random_uuid();
    until timestamptz;
    rooms bigint[] := '{}';
    every_room bigint[];
    room bigint;
    leases fence.lease[];
BEGIN
    IF session_bound IS NULL THEN PERFORM fence_internal.raise_null('session_bound'); END IF;
    IF durable IS NULL THEN PERFORM fence_internal.raise_null('durable'); END IF;
    PERFORM fence_internal.require_writable('acquire a lease');
    IF wait_us > 0 THEN
        PERFORM fence_internal.require_read_committed();
    END IF;
    leases := ARRAY(SELECT l FROM fence_internal.try_grant_all(sorted, ttl_us, who, session_bound, durable, token, true) l);
    IF cardinality(leases) > 0 OR wait_us = 0 THEN
        RETURN QUERY SELECT * FROM unnest(leases);
        RETURN;
    END IF;
    until := clock_timestamp() + wait_us * interval '1 microsecond';
    IF session_bound THEN
        PERFORM fence_internal.hold_session_lock();
    END IF;
    -- First in line for every key: their waiting rooms, in the keys' order; then a look every 10 ms.
    BEGIN
        every_room := ARRAY(SELECT fence_internal.lock_id('room', k) FROM unnest(sorted) k);
        FOREACH room IN ARRAY every_room LOOP
            EXIT WHEN NOT fence_internal.session_lock_until(room, until);
            rooms := rooms || room;
        END LOOP;
        WHILE cardinality(rooms) = cardinality(sorted) AND clock_timestamp() < until LOOP
            leases := ARRAY(SELECT l FROM fence_internal.try_grant_all(sorted, ttl_us, who, session_bound, durable, token, false) l);
            EXIT WHEN cardinality(leases) > 0;
            PERFORM pg_sleep(greatest(0, least(0.01, extract(epoch FROM until - clock_timestamp()))));
        END LOOP;
        PERFORM pg_advisory_unlock(r) FROM unnest(rooms) r;
    EXCEPTION WHEN query_canceled OR others THEN
        -- not `rooms` alone: a room granted as a cancel or a timeout ended its wait is held too
        PERFORM pg_advisory_unlock(r) FROM unnest(every_room) r WHERE fence_internal.lock_held_by_me(r, 'ExclusiveLock');
        RAISE;
    END;
    RETURN QUERY SELECT * FROM unnest(leases);
END
$$;

CREATE FUNCTION fence.renew_all_if_held(keys text[], token uuid, ttl interval) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    sorted text[] := fence_internal.check_keys(keys, 64,
        'Pass an array of 1 to 64 distinct, non-empty keys, such as ARRAY[''invoice:1'', ''invoice:2''].', true);
    ttl_us bigint;
    each text;
    renewed timestamptz;
    earliest timestamptz;
BEGIN
    IF token IS NULL THEN PERFORM fence_internal.raise_null('token'); END IF;
    ttl_us := fence_internal.check_ttl(ttl);
    PERFORM fence_internal.require_writable('renew a lease');
    BEGIN
        FOREACH each IN ARRAY sorted LOOP
            renewed := fence_internal.renew_checked(each, token, ttl_us);
            IF renewed IS NULL THEN
                RAISE SQLSTATE 'PFZ01';
            END IF;
            earliest := least(earliest, renewed);
        END LOOP;
    EXCEPTION WHEN SQLSTATE 'PFZ01' THEN
        RETURN NULL;
    END;
    RETURN earliest;
END
$$;

CREATE FUNCTION fence.lease_release_all(keys text[], token uuid) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    sorted text[] := fence_internal.check_keys(keys, 64,
        'Pass an array of 1 to 64 distinct, non-empty keys, such as ARRAY[''invoice:1'', ''invoice:2''].', true);
BEGIN
    IF token IS NULL THEN PERFORM fence_internal.raise_null('token'); END IF;
    PERFORM fence_internal.require_writable('release a lease');
    RETURN (SELECT count(*) FILTER (WHERE fence_internal.release_checked(k, token) IS NOT NULL)::integer FROM unnest(sorted) k);
END
$$;
