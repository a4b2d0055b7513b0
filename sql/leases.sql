-- lease_renew: a one-line SQL function over a Rust core that answers NULL for "no", raising PF001
-- through PL/pgSQL (pgrx can raise only the SQLSTATEs of its closed PgSqlErrorCode enum; any other
-- becomes XX000). PostgreSQL inlines the shell into the calling query. The fenced writes raise their
-- PF002 from Rust instead (src/pg/own_errors.rs), which lease_renew cannot: its core is SECURITY
-- DEFINER, and only a call through fmgr switches the user.

CREATE FUNCTION fence.raise_lease_lost(key text)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'lease on key "%" is lost', key
        USING ERRCODE = 'PF001',
              DETAIL = 'The token is not the live holder''s: the lease was released, taken over, or has expired.',
              HINT = 'Stop work done under this lease and acquire the key again: a renew cannot bring back a lease that has ended.';
END
$$;

-- The same, naming why the lease ended (lease_status, src/leases/ended.rs).
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

CREATE FUNCTION fence.lease_renew(key text, token uuid, ttl interval)
RETURNS timestamptz
LANGUAGE sql VOLATILE
AS $$ SELECT coalesce(fence.renew_if_held(key, token, ttl), fence.raise_lease_lost(key, token)) $$;

-- lease_renew_all: the same over a lease set's keys and their one token (src/leases/sets.rs).
-- The same for a lease set, naming the first key its token no longer holds, and why.
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

CREATE FUNCTION fence.lease_renew_all(keys text[], token uuid, ttl interval)
RETURNS timestamptz
LANGUAGE sql VOLATILE
AS $$ SELECT coalesce(fence.renew_all_if_held(keys, token, ttl), fence.raise_lease_set_lost(keys, token)) $$;

-- Who holds what, but never the tokens (for fence_user: sql/privileges.sql): a row per live holder,
-- durable or fast, and for a key without one its latest grant. `live` is the condition of
-- src/leases/liveness.rs; `shared` and `permits` the mode it was granted in (src/leases/modes.rs).
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

-- Which edition of pg_fence answers: 'extension' here; the SQL edition's (sql/edition/edition.sql)
-- answers 'sql', so that clients can tell them apart (docs/sql-edition.md).
CREATE FUNCTION fence.edition() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 'extension'::text $$;
