-- pg_fence 0.3.0 -> 0.4.0:
-- - Key locks are named by a SipHash keyed with a random secret (fence.lock_secret), no longer by
--   the public FNV-1a hash, so nobody can pick two keys that share a lock. Restart the server, or
--   end every session that loaded the 0.3.0 library, before this update: an old session would
--   still name the locks by the old hash and not exclude the new ones.
-- - fenced_write and versioned_update check each row again as they write it (fence.fence_not_above,
--   fence.checked_version), so the rows checked are the rows written. fenced_write's core is no
--   longer an SQL function of its own: called directly, it could not undo what it wrote.
-- - Fences are greatest(previous fence + 1, the server clock in microseconds since 1970), so a
--   server rolled onto another history (failover, point-in-time recovery, a restored dump) issues no
--   fence twice, as long as its clock is not behind by more than the time between the two
--   histories' grants (docs/guarantees.md, "Fences, and the one clock assumption"). The first grant after this update is far above the small fences of
--   0.3.0's counter, which stay in the table: resources that stored them keep refusing stale holders.
-- - The sweep deletes rows of leases that ended more than pg_fence.retain_ended ago; fence.high_water
--   keeps the highest fence it deleted.
-- - Fast leases: lease_acquire(.., durable => false) grants a lease kept in the unlogged table
--   fence.fast_lease_state, whose changes wait for no WAL flush, and which a crash or a failover
--   ends. lease_acquire is dropped and created again with the new argument: objects that depend on
--   it (a view, or a function with a BEGIN ATOMIC body, that calls it) must be dropped first.
--   fence.leases gains the column `durable` and shows, per key, its latest grant of either kind.
--   lease_acquire also takes the caller's own `token`: a retried acquire with the same token
--   returns the lease it granted.
-- - Privileges: nothing is for PUBLIC any more. Leases and fencing are for role fence_user, which
--   this update creates; lease_revoke and fence.sweep() for fence_admin. GRANT fence_user TO your
--   applications' roles before (or right after) this update.
\echo Use "ALTER EXTENSION pg_fence UPDATE TO '0.4.0'" to load this file. \quit

-- Every call of pg_fence reads fence.lease_state under the key's lock: waiting for the transactions
-- that did so, and keeping new ones out until this update commits, means no transaction holds a key
-- lock named by the old hash after it (the guard checks that too, src/writes/fencing.rs).
-- fence.sweeper_stats first, in the order a sweep takes the two (it claims its figures, then reads
-- the leases), or a sweep starting between the two locks would deadlock with this update.
LOCK TABLE fence.sweeper_stats, fence.lease_state IN ACCESS EXCLUSIVE MODE;

CREATE TABLE fence.lock_secret (
    one    boolean PRIMARY KEY DEFAULT true CHECK (one),
    secret bytea   NOT NULL
);
INSERT INTO fence.lock_secret (secret)
VALUES (pg_catalog.uuid_send(pg_catalog.gen_random_uuid()) || pg_catalog.uuid_send(pg_catalog.gen_random_uuid()));
REVOKE ALL ON fence.lock_secret FROM PUBLIC;

CREATE TABLE fence.high_water (
    one   boolean PRIMARY KEY DEFAULT true CHECK (one),
    fence bigint  NOT NULL
);
REVOKE ALL ON fence.high_water FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('fence.high_water', '');

ALTER TABLE fence.sweeper_stats ADD COLUMN total_deleted bigint NOT NULL DEFAULT 0;
CREATE OR REPLACE VIEW fence.sweeper AS
    SELECT last_run_at, last_swept, total_swept, total_deleted FROM fence.sweeper_stats;

CREATE FUNCTION fence.fence_not_above(row_fence bigint, fence bigint)
RETURNS boolean
LANGUAGE c VOLATILE COST 1000000
AS 'MODULE_PATHNAME', 'fence_not_above_wrapper';

DROP FUNCTION fence.write_unless_stale(oid, text, bigint, jsonb, jsonb);

CREATE  FUNCTION fence."checked_version"(
	"target" oid, /* Option < pg_sys :: Oid > */
	"row_version" bigint, /* Option < i64 > */
	"expected" bigint /* Option < i64 > */
) RETURNS bigint /* i64 */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'checked_version_wrapper';

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

DROP FUNCTION fence.lease_acquire(text, interval, text, interval, boolean);
CREATE  FUNCTION fence."lease_acquire"(
	"key" TEXT, /* Option < & str > */
	"ttl" interval, /* Option < Interval > */
	"owner" TEXT DEFAULT NULL, /* Option < & str > */
	"wait" interval DEFAULT '0', /* Option < Interval > */
	"session_bound" bool DEFAULT false, /* Option < bool > */
	"durable" bool DEFAULT true, /* Option < bool > */
	"token" uuid DEFAULT NULL /* Option < Uuid > */
) RETURNS fence.lease
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'acquire_wrapper';

CREATE FUNCTION fence.fast_lease_rows()
RETURNS TABLE (key text, owner text, fence bigint, acquired_at timestamptz, expires_at timestamptz,
               session_pid integer, live boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_catalog.pg_is_in_recovery() THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT l.key, l.owner, l.fence, l.acquired_at, l.expires_at, l.session_pid,
           (l.token_hash IS NOT NULL AND l.expires_at > pg_catalog.clock_timestamp()
            AND (l.session_id IS NULL OR coalesce(fence.holder_alive(l.session_pid, l.session_id), false)))
      FROM fence.fast_lease_state l;
END
$$;

CREATE OR REPLACE VIEW fence.leases AS
SELECT DISTINCT ON (key) key, owner, fence, acquired_at, expires_at, session_pid, live, durable
  FROM (SELECT key, owner, fence, acquired_at, expires_at, session_pid,
               (token_hash IS NOT NULL AND expires_at > pg_catalog.clock_timestamp()
                AND (session_id IS NULL OR coalesce(fence.holder_alive(session_pid, session_id), false))) AS live,
               true AS durable
          FROM fence.lease_state
        UNION ALL
        SELECT key, owner, fence, acquired_at, expires_at, session_pid, live, false
          FROM fence.fast_lease_rows()) grants
 ORDER BY key, fence DESC, durable;

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'fence_user') THEN
        CREATE ROLE fence_user NOLOGIN;
    END IF;
    IF NOT pg_catalog.pg_has_role('fence_admin', 'fence_user', 'MEMBER') THEN
        GRANT fence_user TO fence_admin;
    END IF;
END
$$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA fence FROM PUBLIC;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA fence TO fence_user;
REVOKE EXECUTE ON FUNCTION fence.lease_revoke(text), fence.sweep() FROM fence_user;
GRANT EXECUTE ON FUNCTION fence.lease_revoke(text), fence.sweep() TO fence_admin;

REVOKE SELECT ON fence.leases FROM PUBLIC;
GRANT SELECT ON fence.leases TO fence_user;

-- The hint no longer says that an expired lease is never revived: a step back of the server's
-- clock can make a lease nobody took over live again (docs/guarantees.md, "Clock steps").
CREATE OR REPLACE FUNCTION fence.raise_lease_lost(key text)
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

-- fence.stats (src/stats.rs, sql/stats.sql).
CREATE FUNCTION fence.stats_values()
RETURNS TABLE (available boolean, since timestamptz, counters bigint[])
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'stats_values_wrapper';

CREATE FUNCTION fence.stats_reset()
RETURNS boolean
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'stats_reset_wrapper';

CREATE VIEW fence.stats AS
SELECT available, since,
       c[1] AS grants_durable, c[2] AS grants_fast, c[3] AS acquires_refused,
       c[4] AS renewals, c[5] AS renewals_lost, c[6] AS releases, c[7] AS releases_stale,
       c[8] AS expiries_swept, c[9] AS revocations, c[10] AS session_ends,
       c[11] AS waits_begun, c[12] AS waits_granted, c[13] AS waits_timed_out,
       c[14]::float8 / 1000 AS wait_time_total_ms, c[15]::float8 / 1000 AS wait_time_max_ms,
       c[16] AS guards_accepted, c[17] AS guards_refused
  FROM fence.stats_values() AS s(available, since, c);

REVOKE EXECUTE ON FUNCTION fence.stats_values(), fence.stats_reset() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fence.stats_values() TO PUBLIC, fence_user;
GRANT SELECT ON fence.stats TO PUBLIC;
GRANT EXECUTE ON FUNCTION fence.stats_reset() TO fence_admin;

-- The functions that back the public ones say that they are internal (sql/internal.sql).
COMMENT ON FUNCTION fence.renew_if_held(text, uuid, interval) IS
    'pg_fence internal: the core of fence.lease_renew; not part of the API';
COMMENT ON FUNCTION fence.raise_lease_lost(text) IS
    'pg_fence internal: raises fence.lease_renew''s PF001; not part of the API';
COMMENT ON FUNCTION fence.holder_alive(integer, bigint) IS
    'pg_fence internal: whether a session-bound lease''s session is still there; not part of the API';
COMMENT ON FUNCTION fence.fast_lease_rows() IS
    'pg_fence internal: the fast leases'' rows for view fence.leases; not part of the API';
COMMENT ON FUNCTION fence.fence_holds(text, bigint) IS
    'pg_fence internal: the core of fence.fence_guard; not part of the API';
COMMENT ON FUNCTION fence.update_matching(oid, jsonb, jsonb) IS
    'pg_fence internal: the UPDATE that fence.fenced_update makes once its guard passed, without the guard; not part of the API';
COMMENT ON FUNCTION fence.fence_not_above(bigint, bigint) IS
    'pg_fence internal: the fence condition of fence.fenced_write''s UPDATE; not part of the API';
COMMENT ON FUNCTION fence.update_versioned_row(oid, text, bigint, jsonb, jsonb) IS
    'pg_fence internal: the core of fence.versioned_update; not part of the API';
COMMENT ON FUNCTION fence.checked_version(oid, bigint, bigint) IS
    'pg_fence internal: the version check of fence.versioned_update''s UPDATE; not part of the API';
COMMENT ON FUNCTION fence.check_version() IS
    'pg_fence internal: trigger of fence.enable_versioning; not part of the API';
COMMENT ON FUNCTION fence.bump_version() IS
    'pg_fence internal: trigger of fence.enable_versioning; not part of the API';
COMMENT ON FUNCTION fence.require_table(regclass) IS
    'pg_fence internal: the argument check of fence.enable_versioning; not part of the API';
COMMENT ON FUNCTION fence.stats_values() IS
    'pg_fence internal: the core of view fence.stats; not part of the API';
