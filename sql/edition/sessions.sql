-- Session-bound leases (src/leases/line/sessions.rs): the holder's backend keeps a session-level
-- advisory lock on an id of its own, which the lease row records with its pid (session_pid,
-- session_id); PostgreSQL drops it when the session ends, however it ends. "Is the holder's session
-- alive?" is "does pg_locks show backend session_pid holding that lock, granted?", which any role can
-- ask without waiting, and which nobody can fake: another backend that queued on the id and took it
-- when the holder died holds it under its own pid. No pg_stat_activity is read, whose backend_start
-- PostgreSQL hides from roles without pg_read_all_stats. The id is 4 random bytes (so it cannot be
-- guessed and taken first) and 4 bytes of a MAC of them and the pid under the database's secret, and
-- kept in the session's setting fence.session_lock; a rollback undoes the setting but not the lock,
-- and the session finds its lock again in pg_locks by its MAC (one lock per session, however many
-- session-bound grants roll back). pg_advisory_unlock_all() and DISCARD ALL drop the lock, and the
-- next session-bound grant draws a new one, so the leases that lock kept stay ended.
CREATE FUNCTION fence.holder_alive(pid integer, id bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN fence_internal.lock_held_by(pid, id, 'ExclusiveLock');
END
$$;

-- The session lock id of backend `pid` whose random half is `nonce` (4 bytes).
CREATE FUNCTION fence_internal.session_lock_id(pid integer, nonce bytea) RETURNS bigint
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT ('x' || encode(nonce, 'hex')
                || encode(substr(sha256(s.secret || convert_to('session', 'UTF8') || '\x00'::bytea
                                        || convert_to(pid::text, 'UTF8') || '\x00'::bytea || nonce), 1, 4), 'hex'))::bit(64)::bigint
      FROM fence.lock_secret s
$$;

-- Makes sure this session holds its session lock; returns its id.
CREATE FUNCTION fence_internal.hold_session_lock() RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    id bigint := nullif(current_setting('fence.session_lock', true), '')::bigint;
BEGIN
    IF id IS NULL OR NOT fence_internal.lock_held_by_me(id, 'ExclusiveLock') THEN
        -- the lock a rolled-back grant took, if any (its setting rolled back with it)
        id := (SELECT min(h.id)
                 FROM (SELECT l.classid, l.objid, ('x' || lpad(to_hex(l.classid::text::bigint), 8, '0')
                                                        || lpad(to_hex(l.objid::text::bigint), 8, '0'))::bit(64)::bigint AS id
                         FROM pg_locks l
                        WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid() AND l.granted
                          AND l.mode = 'ExclusiveLock' AND l.objsubid = 1
                          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())) h
                WHERE h.id = fence_internal.session_lock_id(pg_backend_pid(),
                                                            decode(lpad(to_hex(h.classid::text::bigint), 8, '0'), 'hex')));
        IF id IS NULL THEN
            id := fence_internal.session_lock_id(pg_backend_pid(), substr(uuid_send(gen_random_uuid()), 1, 4));
            PERFORM pg_advisory_lock(id);
        END IF;
        PERFORM set_config('fence.session_lock', id::text, false);
    END IF;
    RETURN id;
END
$$;
