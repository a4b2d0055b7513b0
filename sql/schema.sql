-- pg_fence schema objects. CREATE EXTENSION creates schema `fence` (named in pg_fence.control) first,
-- or takes the one that exists. Whoever owns that schema can drop everything in it, the leases
-- included, so it must belong to the role installing the extension.
DO $$
BEGIN
    IF (SELECT nspowner FROM pg_catalog.pg_namespace WHERE nspname = 'fence')
       <> (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        RAISE EXCEPTION 'schema "fence" already exists and belongs to another role'
            USING ERRCODE = '42501',
                  HINT = 'Drop or rename that schema, or install pg_fence as its owner.';
    END IF;
    -- Keys and owners are text that pg_fence's Rust code reads as UTF-8; in a database of another
    -- encoding (SQL_ASCII included, which does not check its bytes) a non-ASCII key would fail.
    IF pg_catalog.getdatabaseencoding() <> 'UTF8' THEN
        RAISE EXCEPTION 'pg_fence needs a UTF8 database; this one is %', pg_catalog.getdatabaseencoding()
            USING ERRCODE = '0A000',
                  HINT = 'Create the extension in a database made with ENCODING ''UTF8'' (clients may use any client_encoding).';
    END IF;
END
$$;
--
-- One row per holder of a key in use by durable leases (one per key for exclusive leases): release
-- and expiry only clear the token, and the sweep deletes the row once the lease has ended more than
-- pg_fence.retain_ended ago (src/sweeper/mod.rs). Nobody but the extension's functions touches it.
CREATE TABLE fence.lease_state (
    key         text        NOT NULL,
    fence       bigint      NOT NULL,  -- greatest(previous fence + 1, clock in µs): src/leases/fences.rs
    owner       text        NOT NULL,
    -- SHA-256 of the live holder's token (the token itself is shown once, to the acquirer, and kept
    -- nowhere); NULL once released. An expired lease keeps its hash but is dead: a lease is live
    -- when `token_hash IS NOT NULL AND expires_at > clock_timestamp()` and, if session-bound, its
    -- session is still there (src/leases/liveness.rs).
    token_hash  bytea,
    acquired_at timestamptz NOT NULL,
    -- when the lease ends (or ended: release moves it back to the moment of release)
    expires_at  timestamptz NOT NULL,
    -- for a session-bound lease, the session it ends with: the backend's pid (as in pg_stat_activity)
    -- and its session lock (src/leases/sessions.rs); NULL for a plain lease
    -- (No CHECK that both are set together: PostgreSQL would re-read its expression at every
    -- UPDATE. The liveness condition treats a half-set pair as dead instead.)
    session_pid integer,
    session_id  bigint,
    -- which holder of the key the row is for, and the mode it was granted in (src/leases/modes.rs):
    -- slot 0 for an exclusive lease, 0 .. permits-1 for a semaphore's, any for shared leases
    slot        integer     NOT NULL DEFAULT 0,
    shared      boolean     NOT NULL DEFAULT false,
    permits     integer     NOT NULL DEFAULT 1,
    -- the last lease of this slot that ended, for lease_status (src/leases/ended.rs): its token's
    -- hash, its fence, when and why it ended ('released', 'expired', 'revoked', 'session_ended');
    -- NULL until one ends
    ended_hash   bytea,
    ended_fence  bigint,
    ended_at     timestamptz,
    ended_reason text,
    -- lease_acquire's lock_delay, in microseconds: after an end that is not a release, no grant of
    -- the key until this long after it
    lock_delay  bigint      NOT NULL DEFAULT 0,
    -- a lease handed off (lease_handoff) to the waiting acquirer of this owner, until it claims it
    handed_to   text,
    PRIMARY KEY (key, slot)
) WITH (fillfactor = 70);  -- room on the page so acquire/renew/release stay HOT updates

REVOKE ALL ON fence.lease_state FROM PUBLIC;

-- pg_dump keeps the rows: the leases and their fences are data like any other.
SELECT pg_catalog.pg_extension_config_dump('fence.lease_state', '');

-- Fast leases (lease_acquire(.., durable => false), src/leases/kinds.rs): the same columns (a column
-- added to one table must be added to the other), unlogged, so that their changes write no WAL but
-- their commit records. PostgreSQL empties the table after a
-- crash or an immediate shutdown, and a promoted standby starts with it empty; not dumped either.
CREATE UNLOGGED TABLE fence.fast_lease_state (LIKE fence.lease_state INCLUDING ALL) WITH (fillfactor = 70);
REVOKE ALL ON fence.fast_lease_state FROM PUBLIC;

-- Every fast fence ever told is at most the highest fence here, a row written and flushed before a
-- fast fence above it is told (src/leases/fences.rs). A crash forgets the fast leases, not this: the
-- next grants start above it, even with the clock stepped back. A row per raise, so no raise waits
-- for another; the sweep deletes all but the highest. Dumped, so a restore starts above it too.
CREATE TABLE fence.fast_reserve (fence bigint NOT NULL);
CREATE INDEX fast_reserve_fence ON fence.fast_reserve (fence);
REVOKE ALL ON fence.fast_reserve FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('fence.fast_reserve', '');

-- The highest fence of any row the sweep has deleted, raised in the deleting transaction: a key
-- without a row is granted above it (src/leases/fences.rs), even after a step back of the clock.
-- No row until the first deletion, so that a dump's row restores into an empty table.
CREATE TABLE fence.high_water (
    one   boolean PRIMARY KEY DEFAULT true CHECK (one),
    fence bigint  NOT NULL
);
REVOKE ALL ON fence.high_water FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('fence.high_water', '');

-- The secret that keys the hash naming each key's advisory locks (src/locks/key_hash.rs), drawn at random
-- here, so that nobody can pick two keys that share a lock. Not dumped: a restored database gets
-- its own with its CREATE EXTENSION.
CREATE TABLE fence.lock_secret (
    one    boolean PRIMARY KEY DEFAULT true CHECK (one),
    secret bytea   NOT NULL
);
INSERT INTO fence.lock_secret (secret)
VALUES (pg_catalog.uuid_send(pg_catalog.gen_random_uuid()) || pg_catalog.uuid_send(pg_catalog.gen_random_uuid()));
REVOKE ALL ON fence.lock_secret FROM PUBLIC;

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
    total_swept bigint      NOT NULL DEFAULT 0,  -- leases marked ended
    total_deleted bigint    NOT NULL DEFAULT 0   -- rows deleted after pg_fence.retain_ended
);
INSERT INTO fence.sweeper_stats DEFAULT VALUES;
REVOKE ALL ON fence.sweeper_stats FROM PUBLIC;

CREATE VIEW fence.sweeper AS SELECT last_run_at, last_swept, total_swept, total_deleted FROM fence.sweeper_stats;
GRANT SELECT ON fence.sweeper TO PUBLIC;

-- Every role may see the schema, so that a missing privilege reads "permission denied for function
-- lease_acquire"; what it may call is decided per function (sql/privileges.sql).
GRANT USAGE ON SCHEMA fence TO PUBLIC;
