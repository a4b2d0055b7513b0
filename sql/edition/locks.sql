-- The advisory locks of the SQL edition. PL/pgSQL reaches PostgreSQL's advisory locks only through
-- pg_advisory_*: objsubid 1 (one bigint), never the classes 28774-28779 of the extension's locks
-- (src/locks/keylock.rs), so the two editions' locks can never meet. Each lock is named by 8 bytes
-- of SHA-256 over the database's secret (fence.lock_secret, as src/locks/key_hash.rs keys its
-- SipHash), the lock's class and the key, so that no role can compute a key's lock ahead of time.
-- But pg_locks shows every advisory lock's number to every role, and pg_advisory_lock takes any
-- number: a role that has seen a key's lock there can take it and stall that key's calls. That is
-- a stated limit of this edition (docs/sql-edition.md); the extension's locks are out of SQL's reach.
--
-- | class         | taken as                          | by                                    |
-- |---------------|-----------------------------------|---------------------------------------|
-- | change        | exclusive, transaction            | every change of the key (grant, renew, release, revoke, proclaim, hand-off) |
-- | guard:<slot>  | shared by writers, exclusive by grants, transaction | fence_guard and the fenced writes; the grant replacing that holder |
-- | guard:shared  | the same, for every shared holder | |
-- | room          | exclusive, session (until the call ends) | waiting acquirers, in arrival order |
-- | candidate     | shared, session                   | a waiting acquirer, as a hand-off's candidate |
--
-- The extension's key lock has three modes (src/locks/keylock.rs); advisory locks have two, so its
-- Change mode is the change lock here and its Guard mode the guard lock of slot 0: a grant takes
-- both, a renew or release only the first, a guard only the second. A transaction-level advisory
-- lock cannot be given back, but a subtransaction's rollback gives back what it took: a call that
-- takes a lock and then changes nothing runs in a BEGIN ... EXCEPTION block that it rolls back
-- (SQLSTATE PFZ01, never seen outside).
CREATE FUNCTION fence_internal.lock_id(class text, key text) RETURNS bigint
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT ('x' || encode(substr(sha256(s.secret || convert_to(class, 'UTF8') || '\x00'::bytea
                                        || convert_to(key, 'UTF8')), 1, 8), 'hex'))::bit(64)::bigint
      FROM fence.lock_secret s
$$;

-- Takes a transaction-level advisory lock (shared or not), waiting until `until` at most (NULL:
-- not at all): false, nothing taken, when it could not. The wait runs under lock_timeout in a
-- subtransaction whose rollback takes the waiter out of the queue; a caller's own lock_timeout that
-- ends first ends it with its usual error (55P03), as in the extension.
CREATE FUNCTION fence_internal.lock_until(id bigint, shared boolean, until timestamptz) RETURNS boolean
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ms bigint;
    users_ms bigint;
BEGIN
    IF (SELECT CASE WHEN shared THEN pg_try_advisory_xact_lock_shared(id) ELSE pg_try_advisory_xact_lock(id) END) THEN
        RETURN true;
    END IF;
    IF until IS NULL THEN
        RETURN false;
    END IF;
    ms := ceil(extract(epoch FROM until - clock_timestamp()) * 1000);
    IF ms <= 0 THEN
        RETURN false;
    END IF;
    users_ms := (SELECT setting::bigint FROM pg_settings WHERE name = 'lock_timeout');
    IF users_ms > 0 AND users_ms <= ms THEN
        IF shared THEN PERFORM pg_advisory_xact_lock_shared(id); ELSE PERFORM pg_advisory_xact_lock(id); END IF;
        RETURN true;
    END IF;
    BEGIN
        PERFORM set_config('lock_timeout', least(ms, 2147483647)::text, true);
        IF shared THEN PERFORM pg_advisory_xact_lock_shared(id); ELSE PERFORM pg_advisory_xact_lock(id); END IF;
        PERFORM set_config('lock_timeout', users_ms::text, true);
        RETURN true;
    EXCEPTION WHEN lock_not_available THEN
        RETURN false;
    END;
END
$$;

-- The same for a session-level lock (the waiting room), given back with pg_advisory_unlock.
CREATE FUNCTION fence_internal.session_lock_until(id bigint, until timestamptz) RETURNS boolean
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ms bigint;
    users_ms bigint;
BEGIN
    IF pg_try_advisory_lock(id) THEN
        RETURN true;
    END IF;
    ms := ceil(extract(epoch FROM until - clock_timestamp()) * 1000);
    IF ms <= 0 THEN
        RETURN false;
    END IF;
    users_ms := (SELECT setting::bigint FROM pg_settings WHERE name = 'lock_timeout');
    IF users_ms > 0 AND users_ms <= ms THEN
        PERFORM pg_advisory_lock(id);
        RETURN true;
    END IF;
    BEGIN
        PERFORM set_config('lock_timeout', least(ms, 2147483647)::text, true);
        PERFORM pg_advisory_lock(id);
        PERFORM set_config('lock_timeout', users_ms::text, true);
        RETURN true;
    EXCEPTION WHEN lock_not_available THEN
        -- PostgreSQL may grant the lock as lock_timeout ends the wait: a session-level lock outlives
        -- the rollback, so the caller holds it (and must give it back) when pg_locks says so.
        RETURN fence_internal.lock_held_by_me(id, 'ExclusiveLock');
    END;
END
$$;

-- Whether backend `pid` holds the advisory lock `id` in `mode` (NULL: any), granted, at session or
-- transaction level, as pg_locks shows it: what no other backend can fake by queueing on the lock.
CREATE FUNCTION fence_internal.lock_held_by(pid integer, id bigint, mode text) RETURNS boolean
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT EXISTS (SELECT FROM pg_locks l
                    WHERE l.locktype = 'advisory' AND l.pid = lock_held_by.pid AND l.granted
                      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                      AND l.classid = ((id >> 32) & 4294967295)::text::oid
                      AND l.objid = (id & 4294967295)::text::oid AND l.objsubid = 1
                      AND (lock_held_by.mode IS NULL OR l.mode = lock_held_by.mode))
$$;

-- Whether this backend holds the advisory lock `id` in `mode` (NULL: any): its own locks never
-- conflict with a probe, so it asks pg_locks.
CREATE FUNCTION fence_internal.lock_held_by_me(id bigint, mode text) RETURNS boolean
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$ SELECT fence_internal.lock_held_by(pg_backend_pid(), id, mode) $$;
