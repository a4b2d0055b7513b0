-- Session-bound leases (src/leases/line/sessions.rs): the holder's backend keeps a session-level
-- advisory lock on a random id, which the lease row records with its pid (session_pid,
-- session_id); PostgreSQL drops it when the session ends, however it ends. "Is the holder's session
-- alive?" is "is that lock still held?", which any role can ask without waiting: a shared try-lock
-- that succeeds (and is given back at once) finds it orphaned. No pg_stat_activity is read, whose
-- backend_start PostgreSQL hides from roles without pg_read_all_stats. The id is drawn at random
-- (so it cannot be guessed and taken first) and kept in the session's setting fence.session_lock;
-- pg_advisory_unlock_all() and DISCARD ALL drop the lock, and the next session-bound grant draws a
-- new one, so the leases that lock kept stay ended.
CREATE FUNCTION fence.holder_alive(pid integer, id bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pid = pg_backend_pid() THEN
        RETURN fence.lock_held_by_me(id, 'ExclusiveLock');
    END IF;
    IF pg_try_advisory_lock_shared(id) THEN
        PERFORM pg_advisory_unlock_shared(id);
        RETURN false;
    END IF;
    RETURN true;
END
$$;

-- Makes sure this session holds its session lock; returns its id.
CREATE FUNCTION fence.hold_session_lock() RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    id bigint := nullif(current_setting('fence.session_lock', true), '')::bigint;
BEGIN
    IF id IS NULL OR NOT fence.lock_held_by_me(id, 'ExclusiveLock') THEN
        id := ('x' || encode(substr(uuid_send(gen_random_uuid()), 1, 8), 'hex'))::bit(64)::bigint;
        PERFORM pg_advisory_lock(id);
        PERFORM set_config('fence.session_lock', id::text, false);
    END IF;
    RETURN id;
END
$$;
