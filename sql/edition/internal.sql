-- The SQL edition's own internal functions (as sql/internal.sql marks the shared ones): each says so
-- in its COMMENT, is not part of the API, and may change in any release.
COMMENT ON FUNCTION fence_internal.announce(text,text,bigint) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.candidate_lock(text,text,boolean,integer,boolean) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.check_duration(interval,text,text) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.check_key(text) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.check_keys(text[],integer,text,boolean) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.check_lock_delay(interval) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.check_mode(boolean,integer) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.check_owner(text) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.check_token(uuid) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.check_ttl(interval) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.check_wait(interval) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.claim_handoff(text,bigint,text,boolean,boolean,uuid,boolean,integer,bigint) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.clock_us(timestamp with time zone) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.counter_column(oid,text,text,text,jsonb) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.end_unreleased(text,timestamp with time zone,boolean,integer) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.floor(timestamp with time zone,bigint) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.guard_lock_name(boolean,integer) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.held_back_until(fence.key_row[],timestamp with time zone) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.held_kind(text,bytea) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.hold_session_lock() IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.is_infinite(interval) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.key_locked_by_me(text) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.key_rows(text,timestamp with time zone) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.lease_held_with(text,uuid,boolean) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.lock_held_by_me(bigint,text) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.lock_held_by(integer,bigint,text) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.session_lock_id(integer,bytea) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.lock_id(text,text) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.lock_until(bigint,boolean,timestamp with time zone) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.locks_to_wait_for(boolean,integer,integer,fence.key_row[]) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.micros(interval) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.object_columns(oid,text,text,jsonb,boolean) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.raise_invalid(text,text) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.raise_null(text) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.raise_stale_fence(text,bigint) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.raise_stale_write(text,text,bigint,jsonb) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.raise_version_mismatch(text,bigint,bigint) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.release_checked(text,uuid) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.renew_checked(text,uuid,bigint) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.require_durable_commit() IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.record_session_ends(text,timestamp with time zone) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.require_latest(text,boolean) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.require_read_committed() IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.require_writable(text) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.reserve_fast_fence(bigint,timestamp with time zone) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.reset_floor() IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.seconds_since(timestamp with time zone,double precision,double precision) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.session_lock_until(bigint,timestamp with time zone) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.set_list(oid,text,jsonb) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.setting(text) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.slot_for(boolean,integer,fence.key_row[]) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.free_slots(boolean,integer,fence.key_row[]) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.other_modes_locks(boolean,integer,fence.key_row[]) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.take_slot(text,boolean,integer,fence.key_row[],timestamp with time zone) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.someone_waiting(text) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.sweep_key(text,timestamp with time zone,boolean,integer) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.target_table(text,oid) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.try_grant(text,bigint,text,boolean,boolean,uuid,boolean,integer,bigint,text,timestamp with time zone,boolean) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.try_grant_all(text[],bigint,text,boolean,boolean,uuid,boolean) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.wait_and_grant(text,bigint,text,boolean,boolean,uuid,boolean,integer,bigint,timestamp with time zone) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.where_list(oid,text,jsonb) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.writers_done(text,boolean,integer) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.waiters(text) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.fence_holds(text,bigint) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.type_sql(oid,integer) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.equality_operator(oid) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.run_as_caller(text,boolean,text,jsonb,jsonb,bigint) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.update_matching(oid,jsonb,jsonb,text) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.fenced_update(text,bigint,oid,jsonb,jsonb,text) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.fenced_write(oid,name,bigint,jsonb,jsonb,text) IS
    'pg_fence internal (SQL edition); not part of the API';
COMMENT ON FUNCTION fence_internal.update_versioned_row(oid,text,bigint,jsonb,jsonb,text) IS
    'pg_fence internal (SQL edition); not part of the API';
