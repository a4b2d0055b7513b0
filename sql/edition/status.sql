-- current_fence and lease_status (src/leases/calls/status.rs): the latest committed state (under
-- READ COMMITTED; the transaction's snapshot under the stricter levels), no token shown.
CREATE FUNCTION fence.current_fence(key text) RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER PARALLEL SAFE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM fence_internal.check_key(key);
    IF pg_is_in_recovery() THEN  -- a standby has no fast leases (and cannot read their table)
        RETURN (SELECT max(s.fence) FROM fence.lease_state s WHERE s.key = current_fence.key);
    END IF;
    RETURN greatest((SELECT max(s.fence) FROM fence.lease_state s WHERE s.key = current_fence.key),
                    (SELECT max(s.fence) FROM fence.fast_lease_state s WHERE s.key = current_fence.key));
END
$$;

CREATE FUNCTION fence.lease_status(key text, token uuid)
RETURNS TABLE (state text, reason text, fence bigint, expires_at timestamptz, current_fence bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    hash bytea;
    current bigint;
    r fence.key_row;
BEGIN
    PERFORM fence_internal.check_key(key);
    IF token IS NULL THEN PERFORM fence_internal.raise_null('token'); END IF;
    hash := sha256(uuid_send(token));
    current_fence := fence.current_fence(key);
    current := current_fence;
    FOR r IN SELECT * FROM fence_internal.key_rows(key, clock_timestamp()) ORDER BY durable DESC, slot LOOP
        IF r.token_hash = hash THEN
            IF r.live THEN
                state := 'live'; fence := r.fence; expires_at := r.expires_at;
            ELSE
                state := 'ended'; fence := r.fence;
                reason := CASE WHEN r.session_gone THEN 'session_ended' ELSE 'expired' END;
                expires_at := CASE WHEN r.session_gone THEN NULL ELSE r.expires_at END;
                IF reason = 'expired' AND current > r.fence THEN reason := 'taken_over'; END IF;
            END IF;
            RETURN NEXT;
            RETURN;
        END IF;
        IF r.ended_hash = hash THEN
            state := 'ended'; fence := r.ended_fence; expires_at := r.ended_at;
            reason := CASE WHEN r.ended_reason = 'expired' AND current > r.ended_fence THEN 'taken_over' ELSE r.ended_reason END;
            RETURN NEXT;
            RETURN;
        END IF;
    END LOOP;
    state := 'ended'; reason := 'unknown';
    RETURN NEXT;
END
$$;
