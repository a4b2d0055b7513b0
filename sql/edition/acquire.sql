-- lease_acquire (src/leases/calls/acquire.rs) and waiting in line (src/leases/line/waiting.rs).
--
-- The queue is PostgreSQL's lock manager, as in the extension: a waiter queues for the key's
-- waiting-room lock (a session-level advisory lock, given back when its call ends, however it
-- ends: an EXCEPTION handler gives it back on a cancel or an error, and a session's end drops it),
-- and the one holding it, the head, grants itself the key as soon as there is room. PL/pgSQL has no
-- latch to be woken on: the head looks again every 10 ms (and sleeps no longer than until the
-- lease it waits for expires), so a release, revocation or session's end reaches it within about
-- 10 ms (docs/sql-edition.md).

-- Whether someone is in the key's waiting room (a try-lock of the room, given back at once).
CREATE FUNCTION fence_internal.someone_waiting(key text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    room bigint := fence_internal.lock_id('room', key);
BEGIN
    IF pg_try_advisory_lock(room) THEN
        PERFORM pg_advisory_unlock(room);
        RETURN false;
    END IF;
    RETURN true;
END
$$;

-- The key's live lease, as last committed, if `token` holds it (of one kind only, with `durable`).
-- Under REPEATABLE READ, a lease found is checked to be the latest (fence_internal.require_latest); none
-- found leaves the grant that follows to check.
CREATE FUNCTION fence_internal.lease_held_with(key text, token uuid, durable boolean) RETURNS fence.lease
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    lease fence.lease;
BEGIN
    SELECT key, r.owner, r.fence, token, r.acquired_at, r.expires_at INTO lease
      FROM fence_internal.key_rows(key, clock_timestamp()) r
     WHERE r.live AND r.token_hash = sha256(uuid_send(token)) AND (lease_held_with.durable IS NULL OR r.durable = lease_held_with.durable)
     ORDER BY r.durable
     LIMIT 1;
    IF lease IS NOT NULL THEN
        PERFORM fence_internal.require_latest(key, false);
    END IF;
    RETURN lease;
END
$$;

-- Whether this transaction holds one of the key's locks (it changed or guarded the key): it does not
-- wait for itself.
CREATE FUNCTION fence_internal.key_locked_by_me(key text) RETURNS boolean
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$ SELECT fence_internal.lock_held_by_me(fence_internal.lock_id('change', key), NULL) OR fence_internal.lock_held_by_me(fence_internal.lock_id('guard:0', key), NULL) $$;

CREATE FUNCTION fence.lease_acquire(key text, ttl interval, owner text DEFAULT NULL, wait interval DEFAULT '0',
                                    session_bound boolean DEFAULT false, durable boolean DEFAULT true,
                                    token uuid DEFAULT NULL, shared boolean DEFAULT false,
                                    permits integer DEFAULT 1, lock_delay interval DEFAULT '0')
RETURNS fence.lease
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ttl_us bigint;
    wait_us bigint;
    delay_us bigint;
    who text;
    lease fence.lease;
BEGIN
    PERFORM fence_internal.check_key(key);
    ttl_us := fence_internal.check_ttl(ttl);
    who := fence_internal.check_owner(owner);
    wait_us := fence_internal.check_wait(wait);
    IF session_bound IS NULL THEN PERFORM fence_internal.raise_null('session_bound'); END IF;
    IF durable IS NULL THEN PERFORM fence_internal.raise_null('durable'); END IF;
    PERFORM fence_internal.check_token(token);
    IF shared IS NULL THEN PERFORM fence_internal.raise_null('shared'); END IF;
    IF permits IS NULL THEN PERFORM fence_internal.raise_null('permits'); END IF;
    PERFORM fence_internal.check_mode(shared, permits);
    delay_us := fence_internal.check_lock_delay(lock_delay);
    PERFORM fence_internal.require_writable('acquire a lease');
    IF token IS NOT NULL THEN
        lease := fence_internal.lease_held_with(key, token, NULL);
        IF lease IS NOT NULL THEN
            RETURN lease;
        END IF;
    END IF;
    IF wait_us > 0 THEN
        PERFORM fence_internal.require_read_committed();
    END IF;
    lease := fence_internal.try_grant(key, ttl_us, who, session_bound, durable, token, shared, permits, delay_us, NULL, NULL, true);
    IF lease IS NOT NULL OR wait_us = 0 OR fence_internal.key_locked_by_me(key) THEN
        RETURN lease;
    END IF;
    RETURN fence_internal.wait_and_grant(key, ttl_us, who, session_bound, durable, token, shared, permits, delay_us,
                                clock_timestamp() + wait_us * interval '1 microsecond');
END
$$;

CREATE FUNCTION fence_internal.check_mode(shared boolean, permits integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF permits NOT BETWEEN 1 AND 10000 THEN
        PERFORM fence_internal.raise_invalid(format('permits must be between 1 and 10000, not %s', permits),
            'Pass how many holders the key may have at once: 1 (the default) for an exclusive lease.');
    END IF;
    IF shared AND permits > 1 THEN
        PERFORM fence_internal.raise_invalid('a shared lease cannot have permits',
            'Pass shared => true for a reader''s lease (any number at once), or permits => N for a semaphore, not both.');
    END IF;
END
$$;

CREATE FUNCTION fence_internal.require_read_committed() RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'lease_acquire cannot wait in a REPEATABLE READ or SERIALIZABLE transaction'
            USING ERRCODE = '0A000', HINT = 'Call it with wait in a READ COMMITTED transaction (the default), ideally on its own.';
    END IF;
END
$$;

-- Queues for the key's waiting room and, first in line, grants the key as soon as there is room;
-- NULL when `until` comes first. A waiter stands as a hand-off candidate of its owner meanwhile
-- (sql/edition/handoff.sql).
CREATE FUNCTION fence_internal.wait_and_grant(key text, ttl bigint, owner text, session_bound boolean, durable boolean,
                                     token uuid, shared boolean, permits integer, lock_delay bigint,
                                     until timestamptz)
RETURNS fence.lease
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    room bigint := fence_internal.lock_id('room', key);
    candidate bigint := fence_internal.candidate_lock(key, owner, shared, permits, durable);
    in_room boolean := false;
    standing boolean := false;
    now timestamptz;
    rows fence.key_row[];
    sleep_until timestamptz;
    lease fence.lease;
    -- The wait is counted on a clock of its own, as the extension counts it on the monotonic one: a
    -- step of the wall clock while it waits neither stretches nor shortens it (fence_internal.seconds_since).
    budget float8 := extract(epoch FROM until - clock_timestamp());
    spent float8 := 0;
    last timestamptz := clock_timestamp();
    nap float8;
    gone_seen timestamptz;  -- when this waiter first saw a holder's session gone (unrecorded)
    gone_delay bigint;
BEGIN
    IF session_bound THEN
        PERFORM fence_internal.hold_session_lock();
    END IF;
    BEGIN
        PERFORM pg_advisory_lock_shared(candidate);
        standing := true;
        in_room := fence_internal.session_lock_until(room, clock_timestamp() + budget * interval '1 second');
        spent := spent + fence_internal.seconds_since(last, 0, budget + 1);
        last := clock_timestamp();
        WHILE in_room AND spent < budget LOOP
            IF token IS NOT NULL THEN
                lease := fence_internal.lease_held_with(key, token, durable);
                EXIT WHEN lease IS NOT NULL;
            END IF;
            lease := fence_internal.claim_handoff(key, ttl, owner, session_bound, durable, token, shared, permits, lock_delay);
            EXIT WHEN lease IS NOT NULL;
            now := clock_timestamp();
            rows := ARRAY(SELECT r FROM fence_internal.key_rows(key, now) r);
            IF EXISTS (SELECT FROM unnest(rows) r WHERE r.live AND r.handed_to IS NOT NULL) THEN
                -- a lease handed off to another candidate: to the end of the queue, behind it
                PERFORM pg_advisory_unlock(room);
                in_room := false;
                PERFORM pg_sleep(0.01);
                in_room := fence_internal.session_lock_until(room, clock_timestamp() + (budget - spent) * interval '1 second');
                spent := spent + fence_internal.seconds_since(last, 0.01, budget - spent + 1);
                last := clock_timestamp();
                CONTINUE;
            END IF;
            -- A lock-delay after a session's end counts from this waiter's first sight of it, as in
            -- the extension: once passed, the end is recorded as of then, and the grant goes on.
            gone_delay := (SELECT max(r.lock_delay) FROM unnest(rows) r WHERE r.session_gone AND r.expires_at > now AND r.lock_delay > 0);
            IF gone_delay IS NOT NULL THEN
                gone_seen := coalesce(gone_seen, now);
                IF now < gone_seen + gone_delay * interval '1 microsecond' THEN
                    PERFORM pg_sleep(greatest(0, least(0.01, budget - spent)));
                    spent := spent + fence_internal.seconds_since(last, greatest(0, least(0.01, budget - spent)), 1.01);
                    last := clock_timestamp();
                    CONTINUE;
                END IF;
                PERFORM fence_internal.record_session_ends(key, gone_seen);
                rows := ARRAY(SELECT r FROM fence_internal.key_rows(key, now) r);
            END IF;
            sleep_until := fence_internal.held_back_until(rows, now);
            IF sleep_until IS NULL AND fence_internal.slot_for(shared, permits, rows) IS NULL THEN
                sleep_until := coalesce((SELECT min(r.expires_at) FROM unnest(rows) r WHERE r.live), now);
            END IF;
            IF sleep_until IS NULL THEN
                lease := fence_internal.try_grant(key, ttl, owner, session_bound, durable, token, shared, permits, lock_delay,
                                         NULL, clock_timestamp() + (budget - spent) * interval '1 second', false);
                EXIT WHEN lease IS NOT NULL;
                sleep_until := clock_timestamp() + interval '10 milliseconds';
            END IF;
            nap := greatest(0, least(0.01, budget - spent, extract(epoch FROM sleep_until - clock_timestamp())));
            PERFORM pg_sleep(nap);
            spent := spent + fence_internal.seconds_since(last, nap, nap + 1);
            last := clock_timestamp();
        END LOOP;
        IF in_room THEN
            PERFORM pg_advisory_unlock(room);
        END IF;
        PERFORM pg_advisory_unlock_shared(candidate);
        RETURN lease;
    EXCEPTION WHEN query_canceled OR others THEN
        -- PostgreSQL may grant a lock at the moment a cancel or a timeout ends its wait, and a
        -- session-level lock outlives the rollback: whatever pg_locks says this session holds goes.
        IF in_room OR fence_internal.lock_held_by_me(room, 'ExclusiveLock') THEN
            PERFORM pg_advisory_unlock(room);
        END IF;
        IF standing OR fence_internal.lock_held_by_me(candidate, 'ShareLock') THEN
            PERFORM pg_advisory_unlock_shared(candidate);
        END IF;
        RAISE;
    END;
END
$$;

-- Records the end of the key's leases whose session is gone, as of `at` (a waiter's first sight).
CREATE FUNCTION fence_internal.record_session_ends(key text, at timestamptz) RETURNS void
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE fence.lease_state s
       SET token_hash = NULL, expires_at = least(s.expires_at, at), ended_hash = s.token_hash, ended_fence = s.fence,
           ended_at = least(s.expires_at, at),
           ended_reason = CASE WHEN s.expires_at > at THEN 'session_ended' ELSE 'expired' END
     WHERE s.key = record_session_ends.key AND s.token_hash IS NOT NULL AND s.session_id IS NOT NULL
       AND NOT coalesce(fence.holder_alive(s.session_pid, s.session_id), false);
    UPDATE fence.fast_lease_state s
       SET token_hash = NULL, expires_at = least(s.expires_at, at), ended_hash = s.token_hash, ended_fence = s.fence,
           ended_at = least(s.expires_at, at),
           ended_reason = CASE WHEN s.expires_at > at THEN 'session_ended' ELSE 'expired' END
     WHERE s.key = record_session_ends.key AND s.token_hash IS NOT NULL AND s.session_id IS NOT NULL
       AND NOT coalesce(fence.holder_alive(s.session_pid, s.session_id), false);
$$;

-- Seconds since `last` by the wall clock, when that lies between lo (what surely passed: a sleep's
-- length) and hi; else the clock stepped, and lo is counted.
CREATE FUNCTION fence_internal.seconds_since(last timestamptz, lo float8, hi float8) RETURNS float8
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN d BETWEEN lo AND hi THEN d ELSE lo END
      FROM (SELECT extract(epoch FROM clock_timestamp() - last)::float8 AS d) x
$$;

-- lease_acquire_any (src/leases/calls/first_free.rs): the first key of `keys`, in the order given,
-- that lease_acquire would grant at once.
CREATE FUNCTION fence.lease_acquire_any(keys text[], ttl interval, owner text DEFAULT NULL,
                                        session_bound boolean DEFAULT false, durable boolean DEFAULT true,
                                        token uuid DEFAULT NULL)
RETURNS fence.lease
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    list text[] := fence_internal.check_keys(keys, 1000,
        'Pass an array of 1 to 1000 distinct, non-empty keys in the order to try them, such as ARRAY[''invoice:1'', ''invoice:2''].',
        false);
    ttl_us bigint := fence_internal.check_ttl(ttl);
    who text := fence_internal.check_owner(owner);
    each text;
    lease fence.lease;
BEGIN
    IF session_bound IS NULL THEN PERFORM fence_internal.raise_null('session_bound'); END IF;
    IF durable IS NULL THEN PERFORM fence_internal.raise_null('durable'); END IF;
    PERFORM fence_internal.check_token(token);
    PERFORM fence_internal.require_writable('acquire a lease');
    IF token IS NOT NULL THEN
        FOREACH each IN ARRAY list LOOP
            lease := fence_internal.lease_held_with(each, token, NULL);
            IF lease IS NOT NULL THEN
                RETURN lease;
            END IF;
        END LOOP;
    END IF;
    FOREACH each IN ARRAY list LOOP
        lease := fence_internal.try_grant(each, ttl_us, who, session_bound, durable, token, false, 1, 0, NULL, NULL, true);
        IF lease IS NOT NULL THEN
            RETURN lease;
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

-- How many sessions wait for the key (holding or queueing for its waiting room), from pg_locks.
-- (SECURITY DEFINER for the lock's secret; fence.waiters below, as the extension's, is not.)
CREATE FUNCTION fence_internal.waiters(key text) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    room bigint;
BEGIN
    PERFORM fence_internal.check_key(key);
    room := fence_internal.lock_id('room', key);
    RETURN (SELECT count(*)::integer FROM pg_locks l
             WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.mode = 'ExclusiveLock'
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
               AND l.classid = ((room >> 32) & 4294967295)::text::oid AND l.objid = (room & 4294967295)::text::oid);
END
$$;

CREATE FUNCTION fence.waiters(key text) RETURNS integer
LANGUAGE sql VOLATILE
AS $$ SELECT fence_internal.waiters(key) $$;
