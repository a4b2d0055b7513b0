-- pg_fence schema objects. CREATE EXTENSION creates schema `fence` (named in pg_fence.control) first,
-- or takes the one that exists. Whoever owns that schema can drop everything in it, the fence counters
-- included, so it must belong to the role installing the extension.
DO $$
BEGIN
    IF (SELECT nspowner FROM pg_catalog.pg_namespace WHERE nspname = 'fence')
       <> (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        RAISE EXCEPTION 'schema "fence" already exists and belongs to another role'
            USING ERRCODE = '42501',
                  HINT = 'Drop or rename that schema, or install pg_fence as its owner.';
    END IF;
END
$$;
--
-- One row per key, kept forever: the row *is* the key's fence counter, so release and expiry only
-- clear the token and never reset the fence. Nobody but the extension's functions touches it.
CREATE TABLE fence.lease_state (
    key         text        PRIMARY KEY,
    fence       bigint      NOT NULL,  -- only ever 1 or the previous fence + 1 (leases.rs, GRANT)
    owner       text        NOT NULL,
    -- SHA-256 of the live holder's token (the token itself is shown once, to the acquirer, and kept
    -- nowhere); NULL once released. An expired lease keeps its hash but is dead: a lease is live
    -- when `token_hash IS NOT NULL AND expires_at > clock_timestamp()` and, if session-bound, its
    -- session is still there (src/liveness.rs).
    token_hash  bytea,
    acquired_at timestamptz NOT NULL,
    -- when the lease ends (or ended: release moves it back to the moment of release)
    expires_at  timestamptz NOT NULL,
    -- for a session-bound lease, the session it ends with: the backend's pid (as in pg_stat_activity)
    -- and its session lock (src/sessions.rs); NULL for a plain lease
    -- (No CHECK that both are set together: PostgreSQL would re-read its expression at every
    -- UPDATE. The liveness condition treats a half-set pair as dead instead.)
    session_pid integer,
    session_id  bigint
) WITH (fillfactor = 70);  -- room on the page so acquire/renew/release stay HOT updates

REVOKE ALL ON fence.lease_state FROM PUBLIC;

-- pg_dump must keep the rows, or a restored database would hand out fence 1 again.
SELECT pg_catalog.pg_extension_config_dump('fence.lease_state', '');

-- What lease_acquire returns: the only place a token is ever shown, and only to the caller.
CREATE TYPE fence.lease AS (
    key         text,
    owner       text,
    fence       bigint,
    token       uuid,
    acquired_at timestamptz,
    expires_at  timestamptz
);

-- What the sweeper did (fence.sweep() keeps it): one row, readable by all through fence.sweeper.
CREATE TABLE fence.sweeper_stats (
    one         boolean     PRIMARY KEY DEFAULT true CHECK (one),
    last_run_at timestamptz,
    last_swept  bigint      NOT NULL DEFAULT 0,
    total_swept bigint      NOT NULL DEFAULT 0
);
INSERT INTO fence.sweeper_stats DEFAULT VALUES;
REVOKE ALL ON fence.sweeper_stats FROM PUBLIC;

CREATE VIEW fence.sweeper AS SELECT last_run_at, last_swept, total_swept FROM fence.sweeper_stats;
GRANT SELECT ON fence.sweeper TO PUBLIC;

-- Like advisory locks, leases are for every role by default: the functions check tokens, and the
-- table stays closed. To restrict, REVOKE USAGE ON SCHEMA fence FROM PUBLIC and grant it per role.
GRANT USAGE ON SCHEMA fence TO PUBLIC;
