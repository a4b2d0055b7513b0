-- The SQL edition's own internal functions (as sql/internal.sql marks the shared ones): each says so
-- in its COMMENT, is not part of the API, and may change in any release.
COMMENT ON FUNCTION fence.announce(text,text,bigint) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.candidate_lock(text,text,boolean,integer,boolean) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.check_duration(interval,text,text) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.check_key(text) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.check_keys(text[],integer,text,boolean) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.check_lock_delay(interval) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.check_mode(boolean,integer) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.check_owner(text) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.check_token(uuid) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.check_ttl(interval) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.check_wait(interval) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.claim_handoff(text,bigint,text,boolean,boolean,uuid,boolean,integer,bigint) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.clock_us(timestamp with time zone) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.counter_column(oid,text,text,text,jsonb) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.end_unreleased(text,timestamp with time zone,boolean,integer) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.floor(timestamp with time zone,bigint) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.guard_lock_name(boolean,integer) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.held_back_until(fence.key_row[],timestamp with time zone) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.held_kind(text,bytea) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.hold_session_lock() IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.is_infinite(interval) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.key_locked_by_me(text) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.key_rows(text,timestamp with time zone) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.lease_held_with(text,uuid,boolean) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.lock_held_by_me(bigint,text) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.lock_id(text,text) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.lock_until(bigint,boolean,timestamp with time zone) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.locks_to_wait_for(boolean,integer,integer,fence.key_row[]) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.micros(interval) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.object_columns(oid,text,text,jsonb,boolean) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.raise_invalid(text,text) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.raise_null(text) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.raise_stale_fence(text,bigint) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.raise_stale_write(text,text,bigint,jsonb) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.raise_version_mismatch(text,bigint,bigint) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.release_checked(text,uuid) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.renew_checked(text,uuid,bigint) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.require_durable_commit() IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.record_session_ends(text,timestamp with time zone) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.require_latest(text,boolean) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.require_read_committed() IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.require_writable(text) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.reserve_fast_fence(bigint,timestamp with time zone) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.reset_floor() IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.seconds_since(timestamp with time zone,double precision,double precision) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.session_lock_until(bigint,timestamp with time zone) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.set_list(oid,text,jsonb) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.setting(text) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.slot_for(boolean,integer,fence.key_row[]) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.someone_waiting(text) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.sweep_key(text,timestamp with time zone,boolean,integer) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.target_table(text,oid) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.try_grant(text,bigint,text,boolean,boolean,uuid,boolean,integer,bigint,text,timestamp with time zone,boolean) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.try_grant_all(text[],bigint,text,boolean,boolean,uuid,boolean) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.wait_and_grant(text,bigint,text,boolean,boolean,uuid,boolean,integer,bigint,timestamp with time zone) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.where_list(oid,text,jsonb) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence.writers_done(text,boolean,integer) IS
    'pg_fence internal (SQL edition); not part of the API';
