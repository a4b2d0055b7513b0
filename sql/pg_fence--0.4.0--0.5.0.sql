-- pg_fence 0.4.0 -> 0.5.0 (ALTER EXTENSION pg_fence UPDATE). While 0.5.0 is unreleased, every change to
-- its SQL objects extends this script in the same commit (CONTRIBUTING.md, "Upgrade scripts").

-- Lease sets (src/leases/sets.rs).
CREATE FUNCTION fence.lease_acquire_all(
	"keys" TEXT[],
	"ttl" interval,
	"owner" TEXT DEFAULT NULL,
	"wait" interval DEFAULT '0',
	"session_bound" bool DEFAULT false,
	"durable" bool DEFAULT true
) RETURNS SETOF fence.lease
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'lease_acquire_all_wrapper';

CREATE FUNCTION fence.lease_release_all(
	"keys" TEXT[],
	"token" uuid
) RETURNS INT
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'lease_release_all_wrapper';

CREATE FUNCTION fence.renew_all_if_held(
	"keys" TEXT[],
	"token" uuid,
	"ttl" interval
) RETURNS timestamp with time zone
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'renew_all_if_held_wrapper';

CREATE FUNCTION fence.lease_renew_all(keys text[], token uuid, ttl interval)
RETURNS timestamptz
LANGUAGE sql VOLATILE
AS $$ SELECT coalesce(fence.renew_all_if_held(keys, token, ttl),
                      fence.raise_lease_lost(pg_catalog.array_to_string(keys, ', '))) $$;

COMMENT ON FUNCTION fence.renew_all_if_held(text[], uuid, interval) IS
    'pg_fence internal: the core of fence.lease_renew_all; not part of the API';

REVOKE EXECUTE ON FUNCTION fence.lease_acquire_all(text[], interval, text, interval, boolean, boolean),
    fence.lease_release_all(text[], uuid), fence.renew_all_if_held(text[], uuid, interval),
    fence.lease_renew_all(text[], uuid, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fence.lease_acquire_all(text[], interval, text, interval, boolean, boolean),
    fence.lease_release_all(text[], uuid), fence.renew_all_if_held(text[], uuid, interval),
    fence.lease_renew_all(text[], uuid, interval) TO fence_user;

-- Shared leases and semaphores (src/leases/modes.rs): a row per holder of a key, in a slot of the
-- key, with the mode it was granted in. Every existing row is an exclusive lease, in slot 0.
ALTER TABLE fence.lease_state
    ADD COLUMN slot integer NOT NULL DEFAULT 0,
    ADD COLUMN shared boolean NOT NULL DEFAULT false,
    ADD COLUMN permits integer NOT NULL DEFAULT 1,
    ADD COLUMN ended_hash bytea,
    ADD COLUMN ended_fence bigint,
    ADD COLUMN ended_at timestamptz,
    ADD COLUMN ended_reason text,
    ADD COLUMN lock_delay bigint NOT NULL DEFAULT 0,
    ADD COLUMN handed_to text,
    DROP CONSTRAINT lease_state_pkey,
    ADD PRIMARY KEY (key, slot);
-- (Named as CREATE TABLE .. LIKE names them on PostgreSQL 18, after lease_state's; earlier versions
-- do not name NOT NULL constraints.)
ALTER TABLE fence.fast_lease_state
    ADD COLUMN slot integer CONSTRAINT lease_state_slot_not_null NOT NULL DEFAULT 0,
    ADD COLUMN shared boolean CONSTRAINT lease_state_shared_not_null NOT NULL DEFAULT false,
    ADD COLUMN permits integer CONSTRAINT lease_state_permits_not_null NOT NULL DEFAULT 1,
    ADD COLUMN ended_hash bytea,
    ADD COLUMN ended_fence bigint,
    ADD COLUMN ended_at timestamptz,
    ADD COLUMN ended_reason text,
    ADD COLUMN lock_delay bigint CONSTRAINT lease_state_lock_delay_not_null NOT NULL DEFAULT 0,
    ADD COLUMN handed_to text,
    DROP CONSTRAINT fast_lease_state_pkey,
    ADD PRIMARY KEY (key, slot);

-- fence.leases: a row per live holder, with its mode.
DROP VIEW fence.leases;
DROP FUNCTION fence.fast_lease_rows();
CREATE FUNCTION fence."fast_lease_rows"() RETURNS TABLE (
	"key" TEXT,
	"owner" TEXT,
	"fence" bigint,
	"acquired_at" timestamp with time zone,
	"expires_at" timestamp with time zone,
	"session_pid" INT,
	"live" bool,
	"shared" bool,
	"permits" INT
)
STABLE STRICT SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'fast_lease_rows_wrapper';
COMMENT ON FUNCTION fence.fast_lease_rows() IS
    'pg_fence internal: the fast leases'' rows for view fence.leases; not part of the API';

CREATE VIEW fence.leases AS
SELECT key, owner, fence, acquired_at, expires_at, session_pid, live, durable, shared, permits
  FROM (SELECT grants.*,
               pg_catalog.bool_or(live) OVER per_key AS key_held,
               pg_catalog.row_number() OVER (per_key ORDER BY fence DESC, durable) AS latest
          FROM (SELECT key, owner, fence, acquired_at, expires_at, session_pid,
                       (token_hash IS NOT NULL AND expires_at > pg_catalog.clock_timestamp()
                        AND (session_id IS NULL OR coalesce(fence.holder_alive(session_pid, session_id), false))) AS live,
                       true AS durable, shared, permits
                  FROM fence.lease_state
                UNION ALL
                SELECT key, owner, fence, acquired_at, expires_at, session_pid, live, false, shared, permits
                  FROM fence.fast_lease_rows()) grants
        WINDOW per_key AS (PARTITION BY key)) holders
 WHERE live OR (NOT key_held AND latest = 1)
 ORDER BY key, fence DESC;
REVOKE SELECT ON fence.leases FROM PUBLIC;
GRANT SELECT ON fence.leases TO fence_user;

-- lease_acquire takes `shared`, `permits` and `lock_delay`. It is dropped and created again: objects that depend
-- on it (a view, or a function with a BEGIN ATOMIC body, that calls it) must be dropped first.
DROP FUNCTION fence.lease_acquire(text, interval, text, interval, boolean, boolean, uuid);
CREATE FUNCTION fence."lease_acquire"(
	"key" TEXT,
	"ttl" interval,
	"owner" TEXT DEFAULT NULL,
	"wait" interval DEFAULT '0',
	"session_bound" bool DEFAULT false,
	"durable" bool DEFAULT true,
	"token" uuid DEFAULT NULL,
	"shared" bool DEFAULT false,
	"permits" INT DEFAULT 1,
	"lock_delay" interval DEFAULT '0'
) RETURNS fence.lease
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'acquire_in_mode_wrapper';

REVOKE EXECUTE ON FUNCTION fence.fast_lease_rows(),
    fence.lease_acquire(text, interval, text, interval, boolean, boolean, uuid, boolean, integer, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fence.fast_lease_rows(),
    fence.lease_acquire(text, interval, text, interval, boolean, boolean, uuid, boolean, integer, interval) TO fence_user;

-- Watching a key and advertising a leader's value (src/leases/observe.rs).
CREATE FUNCTION fence."await_change"(
	"key" TEXT,
	"seen_fence" bigint,
	"seen_owner" TEXT,
	"timeout" interval
) RETURNS TABLE (
	"fence" bigint,
	"owner" TEXT,
	"live" bool,
	"acquired_at" timestamp with time zone,
	"expires_at" timestamp with time zone
)
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'await_change_wrapper';

CREATE FUNCTION fence."lease_proclaim"(
	"key" TEXT,
	"token" uuid,
	"owner" TEXT
) RETURNS bool
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'lease_proclaim_wrapper';

REVOKE EXECUTE ON FUNCTION fence.await_change(text, bigint, text, interval),
    fence.lease_proclaim(text, uuid, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fence.await_change(text, bigint, text, interval),
    fence.lease_proclaim(text, uuid, text) TO fence_user;

-- Why a lease ended, and hand-off (src/leases/ended.rs, src/leases/handoff.rs).
CREATE FUNCTION fence."lease_status"(
	"key" TEXT,
	"token" uuid
) RETURNS TABLE (
	"state" TEXT,
	"reason" TEXT,
	"fence" bigint,
	"expires_at" timestamp with time zone,
	"current_fence" bigint
)
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'lease_status_wrapper';

CREATE FUNCTION fence."lease_handoff"(
	"key" TEXT,
	"token" uuid,
	"to_owner" TEXT
) RETURNS fence.lease
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'lease_handoff_wrapper';

CREATE FUNCTION fence.raise_lease_lost(key text, token uuid)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    why text := (SELECT s.reason FROM fence.lease_status(key, token) s);
BEGIN
    RAISE EXCEPTION 'lease on key "%" is lost', key
        USING ERRCODE = 'PF001',
              DETAIL = pg_catalog.format('The token is not the live holder''s: reason %s (see fence.lease_status).', coalesce(why, 'unknown')),
              HINT = 'Stop work done under this lease and acquire the key again: a renew cannot bring back a lease that has ended.';
END
$$;

COMMENT ON FUNCTION fence.raise_lease_lost(text, uuid) IS
    'pg_fence internal: raises fence.lease_renew''s PF001, naming the reason; not part of the API';

CREATE OR REPLACE FUNCTION fence.lease_renew(key text, token uuid, ttl interval)
RETURNS timestamptz
LANGUAGE sql VOLATILE
AS $$ SELECT coalesce(fence.renew_if_held(key, token, ttl), fence.raise_lease_lost(key, token)) $$;

REVOKE EXECUTE ON FUNCTION fence.lease_status(text, uuid), fence.lease_handoff(text, uuid, text),
    fence.raise_lease_lost(text, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fence.lease_status(text, uuid), fence.lease_handoff(text, uuid, text),
    fence.raise_lease_lost(text, uuid) TO fence_user;

-- lease_renew_all's PF001 names the first key its token no longer holds, and why.
CREATE FUNCTION fence.raise_lease_set_lost(keys text[], token uuid)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    lost text;
    why text;
BEGIN
    SELECT k.key, s.reason INTO lost, why
      FROM pg_catalog.unnest(keys) WITH ORDINALITY AS k(key, n), fence.lease_status(k.key, token) s
     WHERE s.state <> 'live'
     ORDER BY k.n LIMIT 1;
    RAISE EXCEPTION 'lease on key "%" is lost', pg_catalog.array_to_string(keys, ', ')
        USING ERRCODE = 'PF001',
              DETAIL = pg_catalog.format('The token is not the live holder''s of key "%s": reason %s (see fence.lease_status).',
                                         coalesce(lost, keys[1]), coalesce(why, 'unknown')),
              HINT = 'Stop work done under these leases and acquire the keys again: a renew cannot bring back a lease that has ended.';
END
$$;

COMMENT ON FUNCTION fence.raise_lease_set_lost(text[], uuid) IS
    'pg_fence internal: raises fence.lease_renew_all''s PF001, naming a lost key and the reason; not part of the API';

CREATE OR REPLACE FUNCTION fence.lease_renew_all(keys text[], token uuid, ttl interval)
RETURNS timestamptz
LANGUAGE sql VOLATILE
AS $$ SELECT coalesce(fence.renew_all_if_held(keys, token, ttl), fence.raise_lease_set_lost(keys, token)) $$;

REVOKE EXECUTE ON FUNCTION fence.raise_lease_set_lost(text[], uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fence.raise_lease_set_lost(text[], uuid) TO fence_user;

-- Kept leases at scale: many renewals in one call, and the first free key of a list
-- (src/leases/calls/renew_many.rs, src/leases/calls/first_free.rs).
CREATE FUNCTION fence."lease_renew_many"(
	"keys" TEXT[],
	"tokens" uuid[],
	"ttls" interval[]
) RETURNS TABLE (
	"key" TEXT,
	"token" uuid,
	"expires_at" timestamp with time zone
)
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'lease_renew_many_wrapper';

CREATE FUNCTION fence."lease_acquire_any"(
	"keys" TEXT[],
	"ttl" interval,
	"owner" TEXT DEFAULT NULL,
	"session_bound" bool DEFAULT false,
	"durable" bool DEFAULT true,
	"token" uuid DEFAULT NULL
) RETURNS fence.lease
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'lease_acquire_any_wrapper';

REVOKE EXECUTE ON FUNCTION fence.lease_renew_many(text[], uuid[], interval[]),
    fence.lease_acquire_any(text[], interval, text, boolean, boolean, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fence.lease_renew_many(text[], uuid[], interval[]),
    fence.lease_acquire_any(text[], interval, text, boolean, boolean, uuid) TO fence_user;

-- Which edition answers (sql/leases.sql).
CREATE FUNCTION fence.edition() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 'extension'::text $$;
REVOKE EXECUTE ON FUNCTION fence.edition() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fence.edition() TO fence_user;
