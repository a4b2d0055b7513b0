-- How a grant's fence is chosen (src/leases/state/fences.rs): the greatest of the clock in
-- microseconds since 1970, the key's highest fence + 1 (its own row's too, in the grant's UPDATE),
-- the high-water mark of deleted rows + 1, and the floor above every fast fence a crash may have
-- forgotten. The same one clock assumption as the extension.
CREATE FUNCTION fence.clock_us(at timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp
AS $$ SELECT (extract(epoch FROM at) * 1000000)::bigint $$;

-- Above every fast fence a reset (crash, immediate shutdown, failover: the unlogged table emptied)
-- may have forgotten: the fast reservation as it stood at the reset, recorded by the first grant
-- after it in a marker row under the empty key, which the reset empties with the table. That first
-- grant waits until the clock has passed the reservation (at most 11 s), so fences stay at the clock.
CREATE FUNCTION fence.reset_floor() RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    marker constant text := 'pg_fence: reset floor, unlogged table';
    floor bigint := (SELECT f.fence FROM fence.fast_lease_state f WHERE f.key = '' AND f.owner = marker);
    ahead bigint;
BEGIN
    IF floor IS NOT NULL THEN
        RETURN floor;
    END IF;
    floor := coalesce((SELECT max(r.fence) + 1 FROM fence.fast_reserve r), 0);
    IF floor - fence.clock_us(clock_timestamp()) <= 11000000 THEN
        LOOP
            ahead := floor - fence.clock_us(clock_timestamp());
            EXIT WHEN ahead <= 0;
            PERFORM pg_sleep(ahead / 1000000.0);
        END LOOP;
    END IF;
    IF current_setting('transaction_isolation') = 'read committed'
       AND pg_try_advisory_xact_lock(fence.lock_id('reset marker', '')) THEN
        DELETE FROM fence.fast_lease_state f WHERE f.key = '' AND f.owner <> marker;
        INSERT INTO fence.fast_lease_state (key, fence, owner, acquired_at, expires_at)
        VALUES ('', floor, marker, clock_timestamp(), clock_timestamp())
        ON CONFLICT DO NOTHING;
    END IF;
    RETURN floor;
END
$$;

-- The lowest fence any grant of a key at `now` may get, besides its own row's fence + 1.
CREATE FUNCTION fence.floor(now timestamptz, other_fence bigint) RETURNS bigint
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT greatest(fence.clock_us(now), other_fence + 1,
                    (SELECT h.fence + 1 FROM fence.high_water h), fence.reset_floor())
$$;

-- Before fast fence `fence` is told: the fast reservation covers it, raised (a row per raise, 2 s
-- ahead of the clock) and flushed with this commit when it did not.
CREATE FUNCTION fence.reserve_fast_fence(fence bigint, now timestamptz) RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF coalesce((SELECT max(r.fence) FROM fence.fast_reserve r) >= fence, false) THEN
        RETURN;
    END IF;
    INSERT INTO fence.fast_reserve (fence) VALUES (greatest(fence, fence.clock_us(now) + 2000000));
    PERFORM fence.require_durable_commit();
END
$$;

-- NOTIFY on channel pg_fence (docs/reference.md, Notifications): pg_fence.notify is a setting any
-- role may SET for its own session, as in the extension; notify_keys is fence.settings'.
CREATE FUNCTION fence.announce(event text, key text, fence bigint) RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF coalesce(current_setting('pg_fence.notify', true), 'off') IN ('on', 'true', 'yes', '1') THEN
        PERFORM pg_notify('pg_fence', CASE WHEN fence.setting('notify_keys')::boolean
            THEN format('{"event":"%s","fence":%s,"key":%s}', event, fence, to_json(key))
            ELSE format('{"event":"%s","fence":%s}', event, fence) END);
    END IF;
END
$$;
