-- What the holder's token may do (src/leases/calls/holder.rs, renew_many.rs, proclaim.rs) and
-- lease_revoke (revoke.rs). A call takes the key's change lock only when the last committed state
-- says it can succeed (src/leases/calls/steps.rs): without the live holder's token nothing is
-- locked, and nobody is held up however often it is called.

-- The live lease's row, if this token's hash holds it (which table it is in).
CREATE FUNCTION fence.held_kind(key text, hash bytea) RETURNS boolean
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT r.durable FROM fence.key_rows(key, clock_timestamp()) r WHERE r.live AND r.token_hash = hash
     ORDER BY r.durable LIMIT 1
$$;

-- The renewal itself (shared by renew_if_held and lease_renew_many), checks done.
CREATE FUNCTION fence.renew_checked(key text, token uuid, ttl bigint) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    hash bytea := sha256(uuid_send(token));
    durable boolean := fence.held_kind(key, hash);
    now timestamptz;
    renewed timestamptz;
BEGIN
    IF durable IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM pg_advisory_xact_lock(fence.lock_id('change', key));
    now := clock_timestamp();
    IF durable THEN
        UPDATE fence.lease_state s SET expires_at = now + ttl * interval '1 microsecond'
         WHERE s.key = renew_checked.key AND s.token_hash = hash AND s.expires_at > now
           AND (s.session_id IS NULL OR coalesce(fence.holder_alive(s.session_pid, s.session_id), false))
        RETURNING s.expires_at INTO renewed;
        IF renewed IS NOT NULL THEN
            PERFORM fence.require_durable_commit();
        END IF;
    ELSE
        UPDATE fence.fast_lease_state s SET expires_at = now + ttl * interval '1 microsecond'
         WHERE s.key = renew_checked.key AND s.token_hash = hash AND s.expires_at > now
           AND (s.session_id IS NULL OR coalesce(fence.holder_alive(s.session_pid, s.session_id), false))
        RETURNING s.expires_at INTO renewed;
    END IF;
    RETURN renewed;
END
$$;

CREATE FUNCTION fence.renew_if_held(key text, token uuid, ttl interval) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ttl_us bigint;
BEGIN
    PERFORM fence.check_key(key);
    IF token IS NULL THEN PERFORM fence.raise_null('token'); END IF;
    ttl_us := fence.check_ttl(ttl);
    PERFORM fence.require_writable('renew a lease');
    RETURN fence.renew_checked(key, token, ttl_us);
END
$$;

-- Ends the lease this token holds: its fence, or NULL when it holds none.
CREATE FUNCTION fence.release_checked(key text, token uuid) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    hash bytea := sha256(uuid_send(token));
    durable boolean := fence.held_kind(key, hash);
    now timestamptz;
    ended bigint;
BEGIN
    IF durable IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM pg_advisory_xact_lock(fence.lock_id('change', key));
    now := clock_timestamp();
    IF durable THEN
        UPDATE fence.lease_state s
           SET token_hash = NULL, expires_at = now, ended_hash = s.token_hash, ended_fence = s.fence,
               ended_at = now, ended_reason = 'released'
         WHERE s.key = release_checked.key AND s.token_hash = hash AND s.expires_at > now
           AND (s.session_id IS NULL OR coalesce(fence.holder_alive(s.session_pid, s.session_id), false))
        RETURNING s.fence INTO ended;
    ELSE
        UPDATE fence.fast_lease_state s
           SET token_hash = NULL, expires_at = now, ended_hash = s.token_hash, ended_fence = s.fence,
               ended_at = now, ended_reason = 'released'
         WHERE s.key = release_checked.key AND s.token_hash = hash AND s.expires_at > now
           AND (s.session_id IS NULL OR coalesce(fence.holder_alive(s.session_pid, s.session_id), false))
        RETURNING s.fence INTO ended;
    END IF;
    IF ended IS NOT NULL THEN
        PERFORM fence.announce('released', key, ended);
    END IF;
    RETURN ended;
END
$$;

CREATE FUNCTION fence.lease_release(key text, token uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM fence.check_key(key);
    IF token IS NULL THEN PERFORM fence.raise_null('token'); END IF;
    PERFORM fence.require_writable('release a lease');
    RETURN fence.release_checked(key, token) IS NOT NULL;
END
$$;

CREATE FUNCTION fence.lease_renew_many(keys text[], tokens uuid[], ttls interval[])
RETURNS TABLE (key text, token uuid, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    hint text := 'Pass three arrays of one length, at most 64: each lease''s key, its token and its new ttl, '
                 'such as ARRAY[''a'', ''b''], ARRAY[token_a, token_b], ARRAY[''30 s'', ''30 s'']::interval[].';
    k text[];
    t uuid[];
    d interval[];
    us bigint[] := '{}';
    renewed timestamptz[];
    i integer;
BEGIN
    IF keys IS NULL THEN PERFORM fence.raise_null('keys'); END IF;
    IF tokens IS NULL THEN PERFORM fence.raise_null('tokens'); END IF;
    IF ttls IS NULL THEN PERFORM fence.raise_null('ttls'); END IF;
    k := ARRAY(SELECT x FROM unnest(keys) x);
    t := ARRAY(SELECT x FROM unnest(tokens) x);
    d := ARRAY(SELECT x FROM unnest(ttls) x);
    IF cardinality(k) <> cardinality(t) OR cardinality(k) <> cardinality(d) THEN
        PERFORM fence.raise_invalid(format('keys, tokens and ttls must be of one length, got %s, %s and %s',
                                           cardinality(k), cardinality(t), cardinality(d)), hint);
    END IF;
    IF cardinality(k) > 64 THEN
        PERFORM fence.raise_invalid(format('%s leases to renew, more than the limit of 64 in one call', cardinality(k)),
                                    'Renew the others in another call.');
    END IF;
    FOR i IN 1 .. cardinality(k) LOOP
        IF k[i] IS NULL THEN PERFORM fence.raise_null('an element of keys'); END IF;
        PERFORM fence.check_key(k[i]);
        IF t[i] IS NULL THEN PERFORM fence.raise_null('an element of tokens'); END IF;
        IF d[i] IS NULL THEN PERFORM fence.raise_null('an element of ttls'); END IF;
        us := us || fence.check_ttl(d[i]);
    END LOOP;
    IF cardinality(k) = 0 THEN
        RETURN;
    END IF;
    PERFORM fence.require_writable('renew a lease');
    renewed := array_fill(NULL::timestamptz, ARRAY[cardinality(k)]);
    -- in one order (by key, then token), so that two calls never wait for each other in a circle
    FOR i IN SELECT n FROM generate_series(1, cardinality(k)) n ORDER BY k[n] COLLATE "C", t[n] LOOP
        renewed[i] := fence.renew_checked(k[i], t[i], us[i]);
    END LOOP;
    RETURN QUERY SELECT k[n], t[n], renewed[n] FROM generate_series(1, cardinality(k)) n;
END
$$;

CREATE FUNCTION fence.lease_proclaim(key text, token uuid, owner text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    who text;
    hash bytea;
    durable boolean;
    now timestamptz;
    done boolean;
BEGIN
    PERFORM fence.check_key(key);
    IF token IS NULL THEN PERFORM fence.raise_null('token'); END IF;
    IF owner IS NULL THEN PERFORM fence.raise_null('owner'); END IF;
    who := fence.check_owner(owner);
    PERFORM fence.require_writable('proclaim a lease''s owner');
    hash := sha256(uuid_send(token));
    durable := fence.held_kind(key, hash);
    IF durable IS NULL THEN
        RETURN false;
    END IF;
    PERFORM pg_advisory_xact_lock(fence.lock_id('change', key));
    now := clock_timestamp();
    IF durable THEN
        UPDATE fence.lease_state s SET owner = who
         WHERE s.key = lease_proclaim.key AND s.token_hash = hash AND s.expires_at > now
           AND (s.session_id IS NULL OR coalesce(fence.holder_alive(s.session_pid, s.session_id), false))
        RETURNING true INTO done;
        IF done THEN
            PERFORM fence.require_durable_commit();
        END IF;
    ELSE
        UPDATE fence.fast_lease_state s SET owner = who
         WHERE s.key = lease_proclaim.key AND s.token_hash = hash AND s.expires_at > now
           AND (s.session_id IS NULL OR coalesce(fence.holder_alive(s.session_pid, s.session_id), false))
        RETURNING true INTO done;
    END IF;
    RETURN coalesce(done, false);
END
$$;

-- lease_revoke: ends every live holder of the key; with none, lifts a running lock-delay.
CREATE FUNCTION fence.lease_revoke(key text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now timestamptz;
    rows fence.key_row[];
    fences bigint[];
    f bigint;
BEGIN
    PERFORM fence.check_key(key);
    PERFORM fence.require_writable('revoke a lease');
    now := clock_timestamp();
    rows := ARRAY(SELECT r FROM fence.key_rows(key, now) r);
    IF NOT EXISTS (SELECT FROM unnest(rows) r WHERE r.live) AND fence.held_back_until(rows, now) IS NULL THEN
        RETURN false;
    END IF;
    PERFORM pg_advisory_xact_lock(fence.lock_id('change', key));
    now := clock_timestamp();
    rows := ARRAY(SELECT r FROM fence.key_rows(key, now) r);
    IF NOT EXISTS (SELECT FROM unnest(rows) r WHERE r.live) THEN
        IF fence.held_back_until(rows, now) IS NULL THEN
            RETURN false;
        END IF;
        UPDATE fence.lease_state s SET lock_delay = 0 WHERE s.key = lease_revoke.key AND s.lock_delay > 0;
        UPDATE fence.fast_lease_state s SET lock_delay = 0 WHERE s.key = lease_revoke.key AND s.lock_delay > 0;
        RETURN true;
    END IF;
    WITH d AS (
        UPDATE fence.lease_state s
           SET token_hash = NULL, expires_at = now, ended_hash = s.token_hash, ended_fence = s.fence,
               ended_at = now, ended_reason = 'revoked'
         WHERE s.key = lease_revoke.key AND s.token_hash IS NOT NULL AND s.expires_at > now
           AND (s.session_id IS NULL OR coalesce(fence.holder_alive(s.session_pid, s.session_id), false))
        RETURNING s.fence),
    f AS (
        UPDATE fence.fast_lease_state s
           SET token_hash = NULL, expires_at = now, ended_hash = s.token_hash, ended_fence = s.fence,
               ended_at = now, ended_reason = 'revoked'
         WHERE s.key = lease_revoke.key AND s.token_hash IS NOT NULL AND s.expires_at > now
           AND (s.session_id IS NULL OR coalesce(fence.holder_alive(s.session_pid, s.session_id), false))
        RETURNING s.fence)
    SELECT array_agg(x.fence) INTO fences FROM (SELECT fence FROM d UNION ALL SELECT fence FROM f) x;
    IF fences IS NULL THEN
        RETURN false;
    END IF;
    PERFORM fence.require_durable_commit();
    FOREACH f IN ARRAY fences LOOP
        PERFORM fence.announce('revoked', key, f);
    END LOOP;
    RETURN true;
END
$$;
