-- The grant (src/leases/calls/grant.rs): under the key's change lock, the slot it takes
-- (src/leases/state/slots.rs), the writers it waits for (the guard locks of the holders it
-- replaces), its fence, its row. Without `until` it waits for nothing: a key another transaction is
-- changing or writing under counts as held. Everything it takes is given back when it grants
-- nothing (the subtransaction's rollback, SQLSTATE PFZ01).
CREATE FUNCTION fence_internal.try_grant(key text, ttl bigint, owner text, session_bound boolean, durable boolean,
                                token uuid, shared boolean, permits integer, lock_delay bigint,
                                handed_to text, until timestamptz, mind_waiters boolean)
RETURNS fence.lease
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    decided timestamptz;
    now timestamptz;
    rows fence.key_row[];
    grant_slot integer;
    floor bigint;
    tok uuid := coalesce(token, gen_random_uuid());
    hash bytea := sha256(uuid_send(coalesce(token, tok)));
    spid integer;
    sid bigint;
    lease fence.lease;
BEGIN
    BEGIN
        IF NOT fence_internal.lock_until(fence_internal.lock_id('change', key), false, until) THEN
            RAISE SQLSTATE 'PFZ01';
        END IF;
        IF mind_waiters AND fence_internal.someone_waiting(key) THEN
            RAISE SQLSTATE 'PFZ01';
        END IF;
        PERFORM fence_internal.require_latest(key, true);
        decided := clock_timestamp();
        rows := ARRAY(SELECT r FROM fence_internal.key_rows(key, decided) r);
        IF fence_internal.held_back_until(rows, decided) IS NOT NULL THEN
            RAISE SQLSTATE 'PFZ01';
        END IF;
        -- An exclusive grant waits for writers under the fence it replaces holding the key's
        -- change lock: the key has no live holder to hold up. A grant beside live holders (a
        -- permit, a shared lease) never waits holding it, which their renewals and releases take
        -- too: it looks again a moment later (src/leases/calls/acquire.rs).
        grant_slot := fence_internal.take_slot(key, shared, permits, rows,
                                               CASE WHEN permits = 1 AND NOT shared THEN until END);
        IF grant_slot IS NULL THEN
            RAISE SQLSTATE 'PFZ01';
        END IF;
        now := greatest(clock_timestamp(), decided);
        floor := fence_internal.floor(now, (SELECT max(r.fence) FROM unnest(rows) r));
        now := greatest(clock_timestamp(), now);
        IF session_bound THEN
            sid := fence_internal.hold_session_lock();
            spid := pg_backend_pid();
        END IF;
        IF durable THEN
            UPDATE fence.lease_state s
               SET fence = greatest(s.fence + 1, floor), owner = try_grant.owner, token_hash = hash,
                   acquired_at = now, expires_at = now + ttl * interval '1 microsecond',
                   session_pid = spid, session_id = sid, shared = try_grant.shared, permits = try_grant.permits,
                   handed_to = try_grant.handed_to, lock_delay = try_grant.lock_delay,
                   ended_hash = coalesce(s.token_hash, s.ended_hash),
                   ended_fence = CASE WHEN s.token_hash IS NULL THEN s.ended_fence ELSE s.fence END,
                   ended_at = CASE WHEN s.token_hash IS NULL THEN s.ended_at ELSE least(s.expires_at, now) END,
                   ended_reason = CASE WHEN s.token_hash IS NULL THEN s.ended_reason
                                       WHEN s.expires_at > now THEN 'session_ended' ELSE 'expired' END
             WHERE s.key = try_grant.key AND s.slot = grant_slot
               AND NOT (s.token_hash IS NOT NULL AND s.expires_at > now
                        AND (s.session_id IS NULL OR coalesce(fence.holder_alive(s.session_pid, s.session_id), false)))
            RETURNING s.key, s.owner, s.fence, tok::uuid, s.acquired_at, s.expires_at INTO lease;
            IF lease IS NULL THEN
                INSERT INTO fence.lease_state AS s (key, slot, shared, permits, handed_to, lock_delay, fence, owner,
                                                    token_hash, acquired_at, expires_at, session_pid, session_id)
                VALUES (key, grant_slot, shared, permits, handed_to, lock_delay, floor, owner, hash, now,
                        now + ttl * interval '1 microsecond', spid, sid)
                ON CONFLICT DO NOTHING
                RETURNING s.key, s.owner, s.fence, tok::uuid, s.acquired_at, s.expires_at INTO lease;
            END IF;
        ELSE
            UPDATE fence.fast_lease_state s
               SET fence = greatest(s.fence + 1, floor), owner = try_grant.owner, token_hash = hash,
                   acquired_at = now, expires_at = now + ttl * interval '1 microsecond',
                   session_pid = spid, session_id = sid, shared = try_grant.shared, permits = try_grant.permits,
                   handed_to = try_grant.handed_to, lock_delay = try_grant.lock_delay,
                   ended_hash = coalesce(s.token_hash, s.ended_hash),
                   ended_fence = CASE WHEN s.token_hash IS NULL THEN s.ended_fence ELSE s.fence END,
                   ended_at = CASE WHEN s.token_hash IS NULL THEN s.ended_at ELSE least(s.expires_at, now) END,
                   ended_reason = CASE WHEN s.token_hash IS NULL THEN s.ended_reason
                                       WHEN s.expires_at > now THEN 'session_ended' ELSE 'expired' END
             WHERE s.key = try_grant.key AND s.slot = grant_slot
               AND NOT (s.token_hash IS NOT NULL AND s.expires_at > now
                        AND (s.session_id IS NULL OR coalesce(fence.holder_alive(s.session_pid, s.session_id), false)))
            RETURNING s.key, s.owner, s.fence, tok::uuid, s.acquired_at, s.expires_at INTO lease;
            IF lease IS NULL THEN
                INSERT INTO fence.fast_lease_state AS s (key, slot, shared, permits, handed_to, lock_delay, fence, owner,
                                                         token_hash, acquired_at, expires_at, session_pid, session_id)
                VALUES (key, grant_slot, shared, permits, handed_to, lock_delay, floor, owner, hash, now,
                        now + ttl * interval '1 microsecond', spid, sid)
                ON CONFLICT DO NOTHING
                RETURNING s.key, s.owner, s.fence, tok::uuid, s.acquired_at, s.expires_at INTO lease;
            END IF;
        END IF;
        IF lease IS NULL THEN
            RAISE SQLSTATE 'PFZ01';
        END IF;
        PERFORM fence_internal.end_unreleased(key, now, durable, grant_slot);
        PERFORM fence_internal.sweep_key(key, now, durable, grant_slot);
        IF durable THEN
            PERFORM fence_internal.require_durable_commit();
        ELSE
            PERFORM fence_internal.reserve_fast_fence(lease.fence, now);
        END IF;
        PERFORM fence_internal.announce('acquired', key, lease.fence);
        RETURN lease;
    EXCEPTION WHEN SQLSTATE 'PFZ01' THEN
        RETURN NULL;
    END;
END
$$;

-- The slot a grant takes (src/leases/state/slots.rs, take_slot), with the guard locks of the
-- writers it waits for: the first free slot whose writers are all done at once, else the first free
-- slot, waiting for its writers until `until` (NULL: not at all). So a writer frozen in its
-- transaction under an ended permit holds back the grant of that permit's slot only. The locks of
-- other modes' ended holders, which every slot needs, are tried once, then each slot's own, in a
-- block whose rollback gives back what a failed try took. NULL when no slot is free or its writers
-- are not done in time; the locks it took then go with the caller's rolled-back subtransaction.
CREATE FUNCTION fence_internal.take_slot(key text, shared boolean, permits integer, rows fence.key_row[],
                                         until timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    free integer[] := fence_internal.free_slots(shared, permits, rows);
    slot integer;
    lock text;
BEGIN
    IF cardinality(free) = 0 THEN
        RETURN NULL;
    END IF;
    IF cardinality(free) > 1 THEN
        BEGIN
            FOREACH lock IN ARRAY fence_internal.other_modes_locks(shared, permits, rows) LOOP
                IF NOT fence_internal.lock_until(fence_internal.lock_id(lock, key), false, NULL) THEN
                    RAISE SQLSTATE 'PFZ01';
                END IF;
            END LOOP;
            FOREACH slot IN ARRAY free LOOP
                IF fence_internal.lock_until(fence_internal.lock_id(fence_internal.guard_lock_name(false, slot), key),
                                             false, NULL) THEN
                    RETURN slot;
                END IF;
            END LOOP;
            RAISE SQLSTATE 'PFZ01';
        EXCEPTION WHEN SQLSTATE 'PFZ01' THEN
            NULL;
        END;
    END IF;
    FOREACH lock IN ARRAY fence_internal.locks_to_wait_for(shared, permits, free[1], rows) LOOP
        IF NOT fence_internal.lock_until(fence_internal.lock_id(lock, key), false, until) THEN
            RETURN NULL;
        END IF;
    END LOOP;
    RETURN free[1];
END
$$;

-- After a grant, the key's other rows whose leases ended without a release are ended for good, so
-- that a step back of the clock cannot make one live again beside the new lease.
CREATE FUNCTION fence_internal.end_unreleased(key text, now timestamptz, granted_durable boolean, granted_slot integer)
RETURNS void
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE fence.lease_state s
       SET token_hash = NULL, expires_at = least(s.expires_at, now), ended_hash = s.token_hash,
           ended_fence = s.fence, ended_at = least(s.expires_at, now),
           ended_reason = CASE WHEN s.expires_at > now THEN 'session_ended' ELSE 'expired' END
     WHERE s.key = end_unreleased.key AND s.token_hash IS NOT NULL
       AND NOT (granted_durable AND s.slot = granted_slot)
       AND NOT (s.expires_at > now AND (s.session_id IS NULL OR coalesce(fence.holder_alive(s.session_pid, s.session_id), false)));
    UPDATE fence.fast_lease_state s
       SET token_hash = NULL, expires_at = least(s.expires_at, now), ended_hash = s.token_hash,
           ended_fence = s.fence, ended_at = least(s.expires_at, now),
           ended_reason = CASE WHEN s.expires_at > now THEN 'session_ended' ELSE 'expired' END
     WHERE s.key = end_unreleased.key AND s.token_hash IS NOT NULL
       AND NOT (NOT granted_durable AND s.slot = granted_slot)
       AND NOT (s.expires_at > now AND (s.session_id IS NULL OR coalesce(fence.holder_alive(s.session_pid, s.session_id), false)));
$$;
