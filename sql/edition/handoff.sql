-- Hand-off (src/leases/calls/handoff.rs): the holder ends its lease and the key goes at once, with
-- a higher fence, to a waiting acquirer named by its owner. A waiter stands as a candidate while it
-- waits (a shared session lock named by its key, owner, mode and kind); lease_handoff grants the
-- key to a token nobody knows, handed_to the candidate's owner, for the rest of the old lease's TTL
-- and 10 s at most; the candidate claims it at its next look as the head of the waiting room (a
-- head that is not the candidate steps back to the end of the queue meanwhile).
CREATE FUNCTION fence_internal.candidate_lock(key text, owner text, shared boolean, permits integer, durable boolean)
RETURNS bigint
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT fence_internal.lock_id('candidate', format('%s:%s%s:%s%s:%s', length(key), key, length(owner), owner,
                                             CASE WHEN shared THEN -1 ELSE permits END, CASE WHEN durable THEN 0 ELSE 1 END))
$$;

CREATE FUNCTION fence.lease_handoff(key text, token uuid, to_owner text) RETURNS fence.lease
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    hash bytea;
    held fence.key_row;
    candidate bigint;
    now timestamptz;
    rows fence.key_row[];
    floor bigint;
    lease fence.lease;
BEGIN
    PERFORM fence_internal.check_key(key);
    IF token IS NULL THEN PERFORM fence_internal.raise_null('token'); END IF;
    IF to_owner IS NULL THEN PERFORM fence_internal.raise_null('to_owner'); END IF;
    IF to_owner = '' THEN
        PERFORM fence_internal.raise_invalid('to_owner must not be empty', 'Name the owner of the waiting acquirer to hand the lease to.');
    END IF;
    PERFORM fence_internal.check_owner(to_owner);
    PERFORM fence_internal.require_writable('hand off a lease');
    hash := sha256(uuid_send(token));
    SELECT * INTO held FROM fence_internal.key_rows(key, clock_timestamp()) r WHERE r.live AND r.token_hash = hash;
    IF held.fence IS NULL THEN
        PERFORM fence_internal.require_latest(key, true);
        RETURN NULL;
    END IF;
    candidate := fence_internal.candidate_lock(key, to_owner, held.shared, held.permits, held.durable);
    IF pg_try_advisory_lock(candidate) THEN
        PERFORM pg_advisory_unlock(candidate);
        RETURN NULL;
    END IF;
    BEGIN
        PERFORM pg_advisory_xact_lock(fence_internal.lock_id('change', key));
        IF NOT fence_internal.lock_until(fence_internal.lock_id(fence_internal.guard_lock_name(held.shared, held.slot), key), false,
                                clock_timestamp() + interval '5 seconds') THEN
            RAISE EXCEPTION 'the lease on key "%" cannot be handed off while writes under it are running', key
                USING ERRCODE = '55P03', HINT = 'Let the transactions writing under the lease end, then call lease_handoff again.';
        END IF;
        PERFORM fence_internal.require_latest(key, true);
        now := clock_timestamp();
        rows := ARRAY(SELECT r FROM fence_internal.key_rows(key, now) r);
        SELECT * INTO held FROM unnest(rows) r WHERE r.live AND r.token_hash = hash;
        IF held.fence IS NULL THEN
            RAISE SQLSTATE 'PFZ01';
        END IF;
        floor := fence_internal.floor(now, (SELECT max(r.fence) FROM unnest(rows) r));
        IF held.durable THEN
            UPDATE fence.lease_state s
               SET fence = greatest(s.fence + 1, floor), owner = to_owner, token_hash = sha256(uuid_send(gen_random_uuid())),
                   acquired_at = now, expires_at = least(s.expires_at, now + interval '10 seconds'),
                   session_pid = NULL, session_id = NULL, handed_to = to_owner, lock_delay = 0,
                   ended_hash = s.token_hash, ended_fence = s.fence, ended_at = now, ended_reason = 'released'
             WHERE s.key = lease_handoff.key AND s.slot = held.slot AND s.token_hash = hash
            RETURNING s.key, s.owner, s.fence, NULL::uuid, s.acquired_at, s.expires_at INTO lease;
            PERFORM fence_internal.require_durable_commit();
        ELSE
            UPDATE fence.fast_lease_state s
               SET fence = greatest(s.fence + 1, floor), owner = to_owner, token_hash = sha256(uuid_send(gen_random_uuid())),
                   acquired_at = now, expires_at = least(s.expires_at, now + interval '10 seconds'),
                   session_pid = NULL, session_id = NULL, handed_to = to_owner, lock_delay = 0,
                   ended_hash = s.token_hash, ended_fence = s.fence, ended_at = now, ended_reason = 'released'
             WHERE s.key = lease_handoff.key AND s.slot = held.slot AND s.token_hash = hash
            RETURNING s.key, s.owner, s.fence, NULL::uuid, s.acquired_at, s.expires_at INTO lease;
            PERFORM fence_internal.reserve_fast_fence(lease.fence, now);
        END IF;
        PERFORM fence_internal.announce('released', key, held.fence);
        PERFORM fence_internal.announce('acquired', key, lease.fence);
        RETURN lease;
    EXCEPTION WHEN SQLSTATE 'PFZ01' THEN
        RETURN NULL;
    END;
END
$$;

-- A waiter's claim of a lease handed off to its owner (mode and kind alike): its own token,
-- expiry, session and lock-delay, keeping the fence.
CREATE FUNCTION fence_internal.claim_handoff(key text, ttl bigint, owner text, session_bound boolean, durable boolean,
                                    token uuid, shared boolean, permits integer, lock_delay bigint)
RETURNS fence.lease
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    tok uuid := coalesce(token, gen_random_uuid());
    handed_slot integer;
    now timestamptz;
    sid bigint;
    lease fence.lease;
BEGIN
    SELECT r.slot INTO handed_slot FROM fence_internal.key_rows(key, clock_timestamp()) r
     WHERE r.live AND r.handed_to = owner AND r.durable = claim_handoff.durable AND r.shared = claim_handoff.shared
       AND r.permits = claim_handoff.permits;
    IF handed_slot IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM pg_advisory_xact_lock(fence_internal.lock_id('change', key));
    now := clock_timestamp();
    IF session_bound THEN
        sid := fence_internal.hold_session_lock();
    END IF;
    IF durable THEN
        UPDATE fence.lease_state s
           SET token_hash = sha256(uuid_send(tok)), expires_at = now + ttl * interval '1 microsecond',
               session_pid = CASE WHEN session_bound THEN pg_backend_pid() END, session_id = sid,
               lock_delay = claim_handoff.lock_delay, handed_to = NULL
         WHERE s.key = claim_handoff.key AND s.slot = handed_slot AND s.handed_to = owner AND s.expires_at > now
        RETURNING s.key, s.owner, s.fence, tok::uuid, s.acquired_at, s.expires_at INTO lease;
        PERFORM fence_internal.require_durable_commit();
    ELSE
        UPDATE fence.fast_lease_state s
           SET token_hash = sha256(uuid_send(tok)), expires_at = now + ttl * interval '1 microsecond',
               session_pid = CASE WHEN session_bound THEN pg_backend_pid() END, session_id = sid,
               lock_delay = claim_handoff.lock_delay, handed_to = NULL
         WHERE s.key = claim_handoff.key AND s.slot = handed_slot AND s.handed_to = owner AND s.expires_at > now
        RETURNING s.key, s.owner, s.fence, tok::uuid, s.acquired_at, s.expires_at INTO lease;
    END IF;
    RETURN lease;
END
$$;
