-- Hostile and malformed input to every function of schema fence (the coverage check below fails if
-- one is added without cases here). Each case shows its outcome, 'ok: <value>' or 'SQLSTATE:
-- message' (through try() of _setup.sql), and whether it left everything as it found it: the rows of
-- pg_fence's tables and of the target table, the triggers on it (same_rows), and the advisory locks
-- this session holds (same_locks).
CREATE EXTENSION pg_fence;

CREATE DOMAIN positive AS int CHECK (VALUE > 0);
CREATE DOMAIN required AS text NOT NULL;
CREATE TABLE target (id int PRIMARY KEY, status text NOT NULL, amount numeric, paid_on date, fence bigint,
                     version bigint NOT NULL DEFAULT 1, small smallint, label varchar(8), doc jsonb,
                     tags text[], gone int,
                     "abcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghij123" int,
                     quantity positive, note required);
ALTER TABLE target DROP COLUMN gone;   -- leaves "........pg.dropped.11........" behind
-- Row 2 sits at the top of its counters: the next version would overflow.
INSERT INTO target VALUES (1, 'open', 100, NULL, 5, 1, 32767, 'a', '{}', '{}', 0, 1, 'n'),
                          (2, 'open', 200, NULL, 5, 9223372036854775807, 1, 'b', '{}', '{}', 0, 1, 'n');
CREATE VIEW target_view AS SELECT * FROM target;
CREATE SEQUENCE target_seq;
CREATE ROLE fence_hostile IN ROLE fence_user;   -- an ordinary role that may use leases, for the cases that need one

-- 'held' is held by its second grant (the first one's fence is stale); 'released' was held and
-- released. The live token, the dead one and the live fence are put into the cases as @token@,
-- @old_token@ and @fence@, so the tokens never reach this file's output; the fences, which differ
-- from run to run, are shown by name (named() of _setup.sql).
SELECT fence AS first_fence, token AS first_token FROM fence.lease_acquire('held', '1 hour', 'first') \gset
SELECT fence.lease_release('held', :'first_token');
SELECT fence, token FROM fence.lease_acquire('held', '1 hour', 'holder') \gset held_
SELECT :held_fence > :first_fence AS second_grant_is_higher;
SELECT jsonb_build_object('@fence@', :held_fence, '@fence@ - 1', :held_fence - 1, '@fence@ + 1', :held_fence + 1,
                          'first fence', :first_fence) AS fences \gset
SELECT token AS old_token FROM fence.lease_acquire('released', '1 hour', 'holder') \gset
SELECT fence.lease_release('released', :'old_token');

-- Everything a case could write, as one digest: pg_fence's tables, the target table and its
-- triggers. SECURITY DEFINER so that the ordinary role's cases can be checked too.
CREATE FUNCTION rows_digest() RETURNS text
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT md5(concat_ws(' | ',
        (SELECT coalesce(string_agg(s::text, ',' ORDER BY key), '-') FROM fence.lease_state s),
        (SELECT coalesce(string_agg(s::text, ',' ORDER BY key), '-') FROM fence.fast_lease_state s),
        (SELECT coalesce(string_agg(s::text, ','), '-') FROM fence.sweeper_stats s),
        (SELECT coalesce(string_agg(t::text, ',' ORDER BY id), '-') FROM public.target t),
        (SELECT coalesce(string_agg(tgname, ',' ORDER BY tgname), '-')
           FROM pg_trigger WHERE tgrelid = 'public.target'::regclass)))
$$;
-- And the advisory locks (pg_fence's key, waiting-room and session locks) this backend holds: a call
-- that is refused, or that changes nothing, must not keep one.
CREATE FUNCTION my_advisory_locks() RETURNS text
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(string_agg(objsubid || '/' || mode, ',' ORDER BY objsubid, mode), '-')
      FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'
$$;

-- Runs one case: its value is caught in a temporary table (temporary tables can be written even in a
-- read-only transaction), its error by try(); and compares the digests before and after it.
CREATE TEMP TABLE case_value (value text);
GRANT INSERT, SELECT, DELETE ON case_value TO fence_hostile;
CREATE FUNCTION run_case(expr text, OUT outcome text, OUT same_rows boolean, OUT same_locks boolean)
LANGUAGE plpgsql AS $$
DECLARE
    rows_before text := rows_digest();
    locks_before text := my_advisory_locks();
BEGIN
    DELETE FROM case_value;
    outcome := try(format('INSERT INTO case_value SELECT (%s)::text', expr));
    IF outcome = 'ok' THEN
        SELECT 'ok: ' || coalesce(value, 'NULL') INTO outcome FROM case_value;
    END IF;
    same_rows := rows_digest() = rows_before;
    same_locks := my_advisory_locks() = locks_before;
END $$;

CREATE TEMP TABLE cases (n serial, block text, expr text);
CREATE TEMP TABLE results (n int, outcome text, same_rows boolean, same_locks boolean);
GRANT SELECT ON cases TO fence_hostile;
GRANT INSERT ON results TO fence_hostile;
-- Runs the cases of a block with the current role and transaction, filling in the placeholders.
CREATE FUNCTION run_block(name text, fence bigint, token uuid, old_token uuid) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO results
    SELECT c.n, r.outcome, r.same_rows, r.same_locks
      FROM (SELECT * FROM cases WHERE block = name ORDER BY n) c,
           LATERAL run_case(replace(replace(replace(c.expr, '@fence@', fence::text),
                                            '@token@', quote_literal(token)),
                                    '@old_token@', quote_literal(old_token))) r
$$;

SELECT rows_digest() AS rows_before_all, my_advisory_locks() AS locks_before_all \gset

-- Block "args": bad arguments, run as the superuser (so that no privilege check hides a case that
-- gets through), in a read-write transaction. Every one must be refused or change nothing.
INSERT INTO cases (block, expr) SELECT 'args', expr FROM (VALUES
    -- lease_acquire: NULLs, keys and owners out of bounds, wrong types
    ($$fence.lease_acquire(NULL, '1 s')$$),
    ($$fence.lease_acquire('k', NULL)$$),
    ($$fence.lease_acquire('k', '1 s', wait => NULL)$$),
    ($$fence.lease_acquire('k', '1 s', session_bound => NULL)$$),
    ($$fence.lease_acquire('k', '1 s', durable => NULL)$$),
    ($$fence.lease_acquire(NULL, NULL, NULL, NULL, NULL)$$),
    ($$fence.lease_acquire(NULL, NULL, NULL, NULL, NULL, NULL)$$),
    ($$fence.lease_acquire('k', '0 s', durable => false)$$),
    ($$fence.lease_acquire('k', '1 s', durable => 'perhaps')$$),
    ($$fence.lease_acquire('held', '1 s', durable => false)$$),
    ($$(SELECT count(*) FROM fence.fast_lease_rows())$$),
    ($$fence.lease_acquire('k', '1 s', token => '00000000-0000-0000-0000-000000000000')$$),
    ($$fence.lease_acquire('k', '1 s', token => 'not-a-uuid')$$),
    ($$fence.lease_acquire('held', '1 s', token => gen_random_uuid())$$),
    ($$fence.lease_acquire(NULL, NULL, NULL, NULL, NULL, NULL, NULL)$$),
    ($$fence.lease_acquire('', '1 s')$$),
    ($$fence.lease_acquire(repeat('k', 513), '1 s')$$),
    ($$fence.lease_acquire(repeat('é', 257), '1 s')$$),
    ($$fence.lease_acquire(repeat('k', 1000000), '1 s')$$),
    ($$fence.lease_acquire('k', '1 s', repeat('o', 257))$$),
    ($$fence.lease_acquire('k', 30)$$),
    ($$fence.lease_acquire(42, '1 s')$$),
    ($$fence.lease_acquire('k', '1 s', session_bound => 'maybe')$$),
    -- lease_acquire's modes: shared and permits NULL, out of range, together, wrong types; a mode
    -- with no room beside the live 'held'
    ($$fence.lease_acquire('k', '1 s', shared => NULL)$$),
    ($$fence.lease_acquire('k', '1 s', permits => NULL)$$),
    ($$fence.lease_acquire('k', '1 s', permits => 0)$$),
    ($$fence.lease_acquire('k', '1 s', permits => -1)$$),
    ($$fence.lease_acquire('k', '1 s', permits => 10001)$$),
    ($$fence.lease_acquire('k', '1 s', permits => 2147483647)$$),
    ($$fence.lease_acquire('k', '1 s', lock_delay => NULL)$$),
    ($$fence.lease_acquire('k', '1 s', lock_delay => '-1 s')$$),
    ($$fence.lease_acquire('k', '1 s', lock_delay => '1 hour 1 microsecond')$$),
    ($$fence.lease_acquire('k', '1 s', lock_delay => 'infinity')$$),
    ($$fence.lease_acquire('k', '1 s', lock_delay => 'soon')$$),
    ($$(fence.lease_acquire('held', '1 s', lock_delay => '1 hour')).fence$$),
    ($$fence.lease_acquire('k', '1 s', permits => 2147483648)$$),
    ($$fence.lease_acquire('k', '1 s', permits => 1.5)$$),
    ($$fence.lease_acquire('k', '1 s', permits => 'many')$$),
    ($$fence.lease_acquire('k', '1 s', shared => 'perhaps')$$),
    ($$fence.lease_acquire('k', '1 s', shared => true, permits => 2)$$),
    ($$fence.lease_acquire('k', '0 s', shared => true)$$),
    ($$fence.lease_acquire('held', '1 s', shared => true)$$),
    ($$fence.lease_acquire('held', '1 s', permits => 2)$$),
    ($$fence.lease_acquire(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)$$),
    -- lease_acquire: intervals zero, negative, huge, "infinite"
    ($$fence.lease_acquire('k', '0 s')$$),
    ($$fence.lease_acquire('k', '0.4 microseconds')$$),
    ($$fence.lease_acquire('k', '-1 s')$$),
    ($$fence.lease_acquire('k', '1 day -25 hours')$$),
    ($$fence.lease_acquire('k', '1 day 0.000001 s')$$),
    ($$fence.lease_acquire('k', '1 mon')$$),
    ($$fence.lease_acquire('k', '178000000 years')$$),
    ($$fence.lease_acquire('k', '999999999999 years')$$),
    -- (PostgreSQL 15 has no infinite interval: 'infinity' is refused as input, 22007, before pg_fence
    -- is called; pg_fence treats 2147483647 months and days, PostgreSQL 17's infinity, as infinite)
    ($$fence.lease_acquire('k', 'infinity')$$),
    ($$fence.lease_acquire('k', '-infinity')$$),
    ($$fence.lease_acquire('k', '2147483647 months 2147483647 days')$$),
    ($$fence.lease_acquire('k', '-2147483648 months -2147483648 days -9223372036854775808 microseconds')$$),
    ($$fence.lease_acquire('k', 'not an interval')$$),
    ($$fence.lease_acquire('k', '1 s', wait => '-1 s')$$),
    ($$fence.lease_acquire('k', '1 s', wait => '1 day -25 hours')$$),
    ($$fence.lease_acquire('k', '1 s', wait => '102 years')$$),
    ($$fence.lease_acquire('k', '1 s', wait => 'infinity')$$),
    ($$fence.lease_acquire('k', '1 s', wait => '2147483647 months 2147483647 days')$$),
    -- lease_acquire of a held key: refused (NULL), with or without a short wait
    ($$fence.lease_acquire('held', '1 s')$$),
    ($$fence.lease_acquire('held', '1 s', wait => '1 ms')$$),
    -- lease_renew
    ($$fence.lease_renew(NULL, gen_random_uuid(), '1 s')$$),
    ($$fence.lease_renew('held', NULL, '1 s')$$),
    ($$fence.lease_renew('held', @token@, NULL)$$),
    ($$fence.lease_renew('', @token@, '1 s')$$),
    ($$fence.lease_renew(repeat('k', 513), @token@, '1 s')$$),
    ($$fence.lease_renew('held', 'not-a-uuid', '1 s')$$),
    ($$fence.lease_renew('held', '00000000-0000-0000-0000-000000000000', '1 s')$$),
    ($$fence.lease_renew('held', gen_random_uuid(), '1 s')$$),
    ($$fence.lease_renew('held', @old_token@, '1 s')$$),
    ($$fence.lease_renew('released', @old_token@, '1 s')$$),
    ($$fence.lease_renew('never-granted', @token@, '1 s')$$),
    ($$fence.lease_renew('held', @token@, '0 s')$$),
    ($$fence.lease_renew('held', @token@, '-1 s')$$),
    ($$fence.lease_renew('held', @token@, '2 days')$$),
    ($$fence.lease_renew('held', @token@, '2147483647 months 2147483647 days')$$),
    ($$fence.lease_renew('held', @token@, 'infinity')$$),
    -- lease_release
    ($$fence.lease_release(NULL, @token@)$$),
    ($$fence.lease_release('held', NULL)$$),
    ($$fence.lease_release('', @token@)$$),
    ($$fence.lease_release(repeat('k', 513), @token@)$$),
    ($$fence.lease_release('held', '')$$),
    ($$fence.lease_release('held', gen_random_uuid())$$),
    ($$fence.lease_release('held', @old_token@)$$),
    ($$fence.lease_release('released', @old_token@)$$),
    ($$fence.lease_release('never-granted', @token@)$$),
    ($$fence.lease_release('held'' OR true --', @old_token@)$$),
    -- lease_proclaim: NULLs, bad keys and owners, a token that does not hold the key
    ($$fence.lease_proclaim(NULL, @token@, 'o')$$),
    ($$fence.lease_proclaim('held', NULL, 'o')$$),
    ($$fence.lease_proclaim('held', @token@, NULL)$$),
    ($$fence.lease_proclaim('', @token@, 'o')$$),
    ($$fence.lease_proclaim(repeat('k', 513), @token@, 'o')$$),
    ($$fence.lease_proclaim('held', @token@, repeat('o', 257))$$),
    ($$fence.lease_proclaim('held', 'not-a-uuid', 'o')$$),
    ($$fence.lease_proclaim('held', gen_random_uuid(), 'o')$$),
    ($$fence.lease_proclaim('held', @old_token@, 'o')$$),
    ($$fence.lease_proclaim('released', @old_token@, 'o')$$),
    ($$fence.lease_proclaim('never-granted', @token@, 'o')$$),
    -- lease_status: NULLs, bad keys and tokens; a stranger's token tells nothing
    ($$fence.lease_status(NULL, @token@)$$),
    ($$fence.lease_status('held', NULL)$$),
    ($$fence.lease_status('', @token@)$$),
    ($$fence.lease_status(repeat('k', 513), @token@)$$),
    ($$fence.lease_status('held', 'not-a-uuid')$$),
    ($$(fence.lease_status('held', gen_random_uuid())).reason$$),
    ($$(fence.lease_status('held', @old_token@)).reason$$),
    ($$(fence.lease_status('released', @old_token@)).reason$$),
    ($$(fence.lease_status('never-granted', @token@)).reason$$),
    ($$(fence.lease_status('held', @token@)).state$$),
    -- lease_handoff: NULLs, bad keys, owners and tokens, nobody waiting
    ($$fence.lease_handoff(NULL, @token@, 'o')$$),
    ($$fence.lease_handoff('held', NULL, 'o')$$),
    ($$fence.lease_handoff('held', @token@, NULL)$$),
    ($$fence.lease_handoff('held', @token@, '')$$),
    ($$fence.lease_handoff('', @token@, 'o')$$),
    ($$fence.lease_handoff(repeat('k', 513), @token@, 'o')$$),
    ($$fence.lease_handoff('held', @token@, repeat('o', 257))$$),
    ($$fence.lease_handoff('held', 'not-a-uuid', 'o')$$),
    ($$fence.lease_handoff('held', gen_random_uuid(), 'o')$$),
    ($$fence.lease_handoff('held', @token@, 'nobody waits')$$),
    ($$fence.lease_handoff('released', @old_token@, 'o')$$),
    -- await_change: NULLs, bad keys, timeouts negative, infinite, huge, wrong types
    ($$fence.await_change(NULL, NULL, NULL, '0')$$),
    ($$fence.await_change('', NULL, NULL, '0')$$),
    ($$fence.await_change(repeat('k', 513), NULL, NULL, '0')$$),
    ($$fence.await_change('held', NULL, NULL, NULL)$$),
    ($$fence.await_change('held', NULL, NULL, '-1 s')$$),
    ($$fence.await_change('held', NULL, NULL, 'infinity')$$),
    ($$fence.await_change('held', NULL, NULL, '2147483647 months 2147483647 days')$$),
    ($$fence.await_change('held', NULL, NULL, '102 years')$$),
    ($$fence.await_change('held', 'x', NULL, '0')$$),
    ($$fence.await_change('held', NULL, NULL, 'soon')$$),
    ($$(fence.await_change('never-granted', NULL, NULL, '0')).live$$),
    ($$(fence.await_change('never-granted', 1, 'o', '0')).live$$),
    -- lease sets: lease_acquire_all, lease_renew_all, lease_release_all
    ($$fence.lease_acquire_all(NULL, '1 s')$$),
    ($$fence.lease_acquire_all(ARRAY[]::text[], '1 s')$$),
    ($$fence.lease_acquire_all(ARRAY['a', NULL], '1 s')$$),
    ($$fence.lease_acquire_all(ARRAY['a', ''], '1 s')$$),
    ($$fence.lease_acquire_all(ARRAY['a', 'b', 'a'], '1 s')$$),
    ($$fence.lease_acquire_all(ARRAY[repeat('k', 513)], '1 s')$$),
    ($$fence.lease_acquire_all(array_fill('k'::text, ARRAY[65]), '1 s')$$),
    ($$fence.lease_acquire_all(ARRAY['a'], NULL)$$),
    ($$fence.lease_acquire_all(ARRAY['a'], '-1 s')$$),
    ($$fence.lease_acquire_all(ARRAY['a'], '1 s', repeat('o', 257))$$),
    ($$fence.lease_acquire_all(ARRAY['a'], '1 s', wait => '-1 s')$$),
    ($$fence.lease_acquire_all(ARRAY['a'], '1 s', session_bound => NULL)$$),
    ($$fence.lease_acquire_all(ARRAY['a'], '1 s', durable => NULL)$$),
    ($$fence.lease_acquire_all('not an array', '1 s')$$),
    ($$fence.lease_acquire_all(ARRAY[1, 2], '1 s')$$),
    ($$(SELECT count(*) FROM fence.lease_acquire_all(ARRAY[['a', 'b'], ['c', 'held']], '1 s'))$$),
    ($$(SELECT count(*) FROM fence.lease_acquire_all(ARRAY['a', 'held'], '1 s'))$$),
    ($$(SELECT count(*) FROM fence.lease_acquire_all(ARRAY['a', 'held'], '1 s', wait => '1 ms'))$$),
    ($$fence.lease_renew_all(NULL, @token@, '1 s')$$),
    ($$fence.lease_renew_all(ARRAY['held'], NULL, '1 s')$$),
    ($$fence.lease_renew_all(ARRAY['held'], @token@, NULL)$$),
    ($$fence.lease_renew_all(ARRAY['held', 'held'], @token@, '1 s')$$),
    ($$fence.lease_renew_all(ARRAY['held'], @token@, '0 s')$$),
    ($$fence.lease_renew_all(ARRAY['held'], gen_random_uuid(), '1 s')$$),
    ($$fence.lease_renew_all(ARRAY['held', 'never-granted'], @token@, '1 s')$$),
    ($$fence.renew_all_if_held(ARRAY['held'], gen_random_uuid(), '1 s')$$),
    ($$fence.renew_all_if_held(ARRAY['held', NULL], @token@, '1 s')$$),
    ($$fence.lease_release_all(NULL, @token@)$$),
    ($$fence.lease_release_all(ARRAY['held'], NULL)$$),
    ($$fence.lease_release_all(ARRAY['held', ''], @token@)$$),
    ($$fence.lease_release_all(ARRAY['held'], gen_random_uuid())$$),
    ($$fence.lease_release_all(ARRAY['held', 'released'], @old_token@)$$),
    -- many leases in one call: lease_renew_many, lease_acquire_any
    ($$(SELECT count(*) FROM fence.lease_renew_many(NULL, ARRAY[@token@]::uuid[], ARRAY['1 s'::interval]))$$),
    ($$(SELECT count(*) FROM fence.lease_renew_many(ARRAY['held'], NULL, ARRAY['1 s'::interval]))$$),
    ($$(SELECT count(*) FROM fence.lease_renew_many(ARRAY['held'], ARRAY[@token@]::uuid[], NULL))$$),
    ($$(SELECT count(*) FROM fence.lease_renew_many(ARRAY['held', 'held'], ARRAY[@token@]::uuid[], ARRAY['1 s'::interval]))$$),
    ($$(SELECT count(*) FROM fence.lease_renew_many(ARRAY[NULL], ARRAY[@token@]::uuid[], ARRAY['1 s'::interval]))$$),
    ($$(SELECT count(*) FROM fence.lease_renew_many(ARRAY['held'], ARRAY[NULL::uuid], ARRAY['1 s'::interval]))$$),
    ($$(SELECT count(*) FROM fence.lease_renew_many(ARRAY['held'], ARRAY[@token@]::uuid[], ARRAY[NULL::interval]))$$),
    ($$(SELECT count(*) FROM fence.lease_renew_many(ARRAY['held'], ARRAY[@token@]::uuid[], ARRAY['0 s'::interval]))$$),
    ($$(SELECT count(*) FROM fence.lease_renew_many(ARRAY['held'], ARRAY[@token@]::uuid[], ARRAY['infinity'::interval]))$$),
    ($$(SELECT count(*) FROM fence.lease_renew_many(ARRAY[''], ARRAY[@token@]::uuid[], ARRAY['1 s'::interval]))$$),
    ($$(SELECT count(*) FROM fence.lease_renew_many(ARRAY[repeat('k', 513)], ARRAY[@token@]::uuid[], ARRAY['1 s'::interval]))$$),
    ($$(SELECT count(*) FROM fence.lease_renew_many(array_fill('held'::text, ARRAY[65]), array_fill(@token@::uuid, ARRAY[65]), array_fill('1 s'::interval, ARRAY[65])))$$),
    ($$(SELECT count(*) FROM fence.lease_renew_many(ARRAY[]::text[], ARRAY[]::uuid[], ARRAY[]::interval[]))$$),
    ($$(SELECT count(expires_at) FROM fence.lease_renew_many(ARRAY['held', 'released'], ARRAY[gen_random_uuid(), @old_token@], ARRAY['1 s', '1 s']::interval[]))$$),
    ($$fence.lease_acquire_any(NULL, '1 s')$$),
    ($$fence.lease_acquire_any(ARRAY[]::text[], '1 s')$$),
    ($$fence.lease_acquire_any(ARRAY['a', NULL], '1 s')$$),
    ($$fence.lease_acquire_any(ARRAY['a', ''], '1 s')$$),
    ($$fence.lease_acquire_any(ARRAY['a', 'b', 'a'], '1 s')$$),
    ($$fence.lease_acquire_any(ARRAY[repeat('k', 513)], '1 s')$$),
    ($$fence.lease_acquire_any(array_fill('k'::text, ARRAY[1001]), '1 s')$$),
    ($$fence.lease_acquire_any(ARRAY['a'], NULL)$$),
    ($$fence.lease_acquire_any(ARRAY['a'], '-1 s')$$),
    ($$fence.lease_acquire_any(ARRAY['a'], '1 s', repeat('o', 257))$$),
    ($$fence.lease_acquire_any(ARRAY['a'], '1 s', session_bound => NULL)$$),
    ($$fence.lease_acquire_any(ARRAY['a'], '1 s', durable => NULL)$$),
    ($$fence.lease_acquire_any(ARRAY['a'], '1 s', token => '00000000-0000-0000-0000-000000000000')$$),
    ($$fence.lease_acquire_any('not an array', '1 s')$$),
    ($$fence.lease_acquire_any(ARRAY['held'], '1 s')$$),
    -- current_fence
    ($$fence.current_fence(NULL)$$),
    ($$fence.current_fence('')$$),
    ($$fence.current_fence(repeat('k', 513))$$),
    ($$fence.current_fence('never-granted')$$),
    ($$fence.current_fence('held'' OR true --')$$),
    ($$fence.current_fence('held')$$),
    -- waiters
    ($$fence.waiters(NULL)$$),
    ($$fence.waiters('')$$),
    ($$fence.waiters(repeat('k', 513))$$),
    ($$fence.waiters('held'' OR true --')$$),
    ($$fence.waiters('held')$$),
    -- require_table (behind enable_versioning / disable_versioning)
    ($$fence.require_table(NULL)$$),
    ($$fence.require_table(0)$$),
    ($$fence.require_table('target')$$),
    -- lease_revoke (as the superuser; the ordinary role is refused in block "role")
    ($$fence.lease_revoke(NULL)$$),
    ($$fence.lease_revoke('')$$),
    ($$fence.lease_revoke(repeat('k', 513))$$),
    ($$fence.lease_revoke('never-granted')$$),
    ($$fence.lease_revoke('released')$$),
    ($$fence.lease_revoke('held''; DELETE FROM fence.lease_state; --')$$),
    -- sweep takes no argument (it runs in block "read-only", where it must not change anything)
    ($$fence.sweep(NULL)$$),
    ($$fence.sweep(10000)$$),
    -- fence_guard and its core fence_holds
    ($$fence.fence_guard(NULL, @fence@)$$),
    ($$fence.fence_guard('held', NULL)$$),
    ($$fence.fence_guard('', @fence@)$$),
    ($$fence.fence_guard(repeat('k', 513), @fence@)$$),
    ($$fence.fence_guard('never-granted', 1)$$),
    ($$fence.fence_guard('released', 1)$$),
    ($$fence.fence_guard('held', @fence@ - 1)$$),
    ($$fence.fence_guard('held', @fence@ + 1)$$),
    ($$fence.fence_guard('held', 0)$$),
    ($$fence.fence_guard('held', -1)$$),
    ($$fence.fence_guard('held', 9223372036854775807)$$),
    ($$fence.fence_guard('held', -9223372036854775808)$$),
    ($$fence.fence_guard('held', 'two')$$),
    ($$fence.fence_guard('held', 1.5)$$),
    ($$fence.fence_guard('held'' OR true --', @fence@)$$),
    ($$fence.fence_holds(NULL, @fence@)$$),
    ($$fence.fence_holds('held', NULL)$$),
    ($$fence.fence_holds('', 1)$$),
    ($$fence.fence_holds('never-granted', 1)$$),
    ($$fence.fence_holds('held', @fence@ - 1)$$),
    -- fenced_update: NULLs (checked after the guard, which passes with @fence@), stale fences
    ($$fence.fenced_update(NULL, @fence@, 'target', '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', NULL, 'target', '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, NULL, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', NULL, '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"status": "x"}', NULL)$$),
    ($$fence.fenced_update('held', @fence@ - 1, 'target', '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.fenced_update('never-granted', 1, 'target', '{"status": "x"}', '{"id": 1}')$$),
    -- fenced_update: unknown tables, and relations that are not tables
    ($$fence.fenced_update('held', @fence@, 'no_such_table', '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 0::oid::regclass, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 4294967295::oid::regclass, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target_view', '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target_seq', '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target_pkey', '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target; DROP TABLE target', '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, '"target; DROP TABLE target"', '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target"; DROP TABLE target; --', '{"status": "x"}', '{"id": 1}')$$),
    -- fenced_update: changes of the wrong shape
    ($$fence.fenced_update('held', @fence@, 'target', '{}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '[]', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '[{"status": "x"}]', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '"status"', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '42', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', 'true', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', 'null', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"status": "x"', '{"id": 1}')$$),
    -- fenced_update: values of the wrong type, out of range, or breaking a constraint
    ($$fence.fenced_update('held', @fence@, 'target', '{"amount": {"a": 1}}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"amount": [1]}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"amount": true}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"amount": "lots"}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"paid_on": "2026-02-30"}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"paid_on": 17}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"tags": "not an array"}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"tags": {"a": 1}}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"small": 40000}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"label": "longer than eight"}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"status": null}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"id": 2}', '{"id": 1}')$$),
    -- fenced_update: keys that are no column, or that try to inject SQL
    ($$fence.fenced_update('held', @fence@, 'target', '{"nope": 1}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"": 1}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"Status": "x"}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"status ": "x"}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"ctid": "(0,1)"}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"........pg.dropped.11........": 1}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"abcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghij123xyz": 1}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"status\"; DROP TABLE target; --": "x"}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"status\" = NULL, \"amount": 1}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"status = status || ''x'' --": 1}', '{"id": 1}')$$),
    -- fenced_update: filters of the wrong shape, type, or trying to match more rows
    ($$fence.fenced_update('held', @fence@, 'target', '{"status": "x"}', '{}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"status": "x"}', '[]')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"status": "x"}', '"id"')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"status": "x"}', '1')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"status": "x"}', 'null')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"status": "x"}', '{"id": null}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"status": "x"}', '{"id": "1 OR 1=1"}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"status": "x"}', '{"id": [1, 2]}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"status": "x"}', '{"id": {"$gt": 0}}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"status": "x"}', '{"id": 1.5}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"status": "x"}', '{"id": 99999999999}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"status": "x"}', '{"id = id OR true; --": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"status": "x"}', '{"1=1) OR (id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"status": "x"}', '{"id": 999}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"status": "x"}', '{"id": 1, "id": 999}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"status": "x"}', '{"doc": {"id": 1}}')$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"status": "x"}', '{"nope": 1}')$$),
    ($$fence.fenced_update('held'' OR true --', @fence@, 'target', '{"status": "x"}', '{"id": 1}')$$),
    -- update_matching, fenced_update's core: no fence at all, so only the target checks stand; and
    -- the values, which it converts itself, must meet their column's type, length and domain
    ($$fence.update_matching(NULL, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.update_matching(0, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.update_matching(4294967295, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.update_matching('target'::regclass, '{"status": "x"}', '[]')$$),
    ($$fence.update_matching('target'::regclass, '{"status": "x"}', '{"id": 999}')$$),
    ($$fence.update_matching('target'::regclass, '{"label": "longer than eight"}', '{"id": 1}')$$),
    ($$fence.update_matching('target'::regclass, '{"status": "x"}', '{"label": "longer than eight"}')$$),
    ($$fence.update_matching('target'::regclass, '{"status": "x"}', '{"id": "one"}')$$),
    ($$fence.update_matching('target'::regclass, '{"note": null}', '{"id": 1}')$$),
    ($$fence.update_matching('target'::regclass, '{"quantity": -1}', '{"id": 1}')$$),
    -- fenced_write (row 1 holds fence 5)
    ($$fence.fenced_write(NULL, 'fence', 9, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.fenced_write('target', NULL, 9, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.fenced_write('target', 'fence', NULL, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.fenced_write('target', 'fence', 9, NULL, '{"id": 1}')$$),
    ($$fence.fenced_write('target', 'fence', 9, '{"status": "x"}', NULL)$$),
    ($$fence.fenced_write('target', 'fence', 4, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.fenced_write('target', 'fence', -9223372036854775808, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.fenced_write('target', '', 9, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.fenced_write('target', 'nope', 9, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.fenced_write('target', 'ctid', 9, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.fenced_write('target', 'status', 9, '{"amount": 1}', '{"id": 1}')$$),
    ($$fence.fenced_write('target', 'amount', 9, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.fenced_write('target', 'fence" = 0; --', 9, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.fenced_write('target', 'fence', 9, '{"fence": 1}', '{"id": 1}')$$),
    ($$fence.fenced_write('target', 'small', 40000, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.fenced_write('target', 'fence', 9, '{}', '{"id": 1}')$$),
    ($$fence.fenced_write('target', 'fence', 9, '{"status": "x"}', '[{"id": 1}]')$$),
    ($$fence.fenced_write('target', 'fence', 9, '{"status": "x"}', '{"id": 999}')$$),
    ($$fence.fenced_write('target_view', 'fence', 9, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.fenced_write('no_such_table', 'fence', 9, '{"status": "x"}', '{"id": 1}')$$),
    -- fence_not_above, the row check in fenced_write's UPDATE: a bare answer, changing nothing
    ($$fence.fence_not_above(5, 9)$$),
    ($$fence.fence_not_above(9, 5)$$),
    ($$fence.fence_not_above(NULL, 5)$$),
    ($$fence.fence_not_above(5, NULL)$$),
    -- versioned_update and its core update_versioned_row (row 1 is at version 1, row 2 at the top)
    ($$fence.versioned_update(NULL, 'version', 1, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.versioned_update('target', NULL, 1, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.versioned_update('target', 'version', NULL, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.versioned_update('target', 'version', 1, NULL, '{"id": 1}')$$),
    ($$fence.versioned_update('target', 'version', 1, '{"status": "x"}', NULL)$$),
    ($$fence.versioned_update('target', 'version', 0, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.versioned_update('target', 'version', -1, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.versioned_update('target', 'version', 9223372036854775807, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.versioned_update('target', 'version', 9223372036854775807, '{"status": "x"}', '{"id": 2}')$$),
    ($$fence.versioned_update('target', 'small', 32767, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.versioned_update('target', 'fence', 1, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.versioned_update('target', 'version', 1, '{"status": "x"}', '{"id": 999}')$$),
    ($$fence.versioned_update('target', 'version', 1, '{"status": "x"}', '{"status": "open"}')$$),
    ($$fence.versioned_update('target', 'version', 1, '{"version": 2}', '{"id": 1}')$$),
    ($$fence.versioned_update('target', '', 1, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.versioned_update('target', 'nope', 1, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.versioned_update('target', 'status', 1, '{"amount": 1}', '{"id": 1}')$$),
    ($$fence.versioned_update('target', 'version; DROP TABLE target', 1, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.versioned_update('target', 'version', 1, '["status"]', '{"id": 1}')$$),
    ($$fence.versioned_update('target', 'version', 1, '{"nope": 1}', '{"id": 1}')$$),
    ($$fence.versioned_update('target', 'version', 1, '{"status": "x"}', '{"id": null}')$$),
    ($$fence.versioned_update('target_seq', 'last_value', 1, '{"is_called": true}', '{"log_cnt": 0}')$$),
    ($$fence.update_versioned_row(NULL, 'version', 1, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.update_versioned_row('target'::regclass, 'version', 0, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.update_versioned_row(0, 'version', 1, '{"status": "x"}', '{"id": 1}')$$),
    -- checked_version, the row check in versioned_update's UPDATE
    ($$fence.checked_version('target'::regclass, 1, 1)$$),
    ($$fence.checked_version('target'::regclass, 2, 1)$$),
    ($$fence.checked_version('target'::regclass, NULL, 1)$$),
    ($$fence.checked_version('target'::regclass, 1, NULL)$$),
    ($$fence.checked_version(0, 1, 2)$$),
    ($$fence.checked_version('target'::regclass, 9223372036854775807, 9223372036854775807)$$),
    -- enable_versioning and disable_versioning
    ($$fence.enable_versioning(NULL)$$),
    ($$fence.enable_versioning('target', NULL)$$),
    ($$fence.enable_versioning('no_such_table')$$),
    ($$fence.enable_versioning(0)$$),
    ($$fence.enable_versioning(12345)$$),
    ($$fence.enable_versioning('target', '')$$),
    ($$fence.enable_versioning('target', 'nope')$$),
    ($$fence.enable_versioning('target', 'ctid')$$),
    ($$fence.enable_versioning('target', 'status')$$),
    ($$fence.enable_versioning('target', 'amount')$$),
    ($$fence.enable_versioning('target', 'version"; DROP TABLE target; --')$$),
    ($$fence.enable_versioning('target; DROP TABLE target')$$),
    ($$fence.enable_versioning('target_view')$$),
    ($$fence.enable_versioning('target_seq', 'last_value')$$),
    ($$fence.disable_versioning(NULL)$$),
    ($$fence.disable_versioning('no_such_table')$$),
    ($$fence.disable_versioning(0)$$),
    ($$fence.disable_versioning(12345)$$),
    ($$fence.disable_versioning('target_view')$$),
    -- renew_if_held, lease_renew's core: NULL for "no"
    ($$fence.renew_if_held(NULL, @token@, '1 s')$$),
    ($$fence.renew_if_held('held', NULL, '1 s')$$),
    ($$fence.renew_if_held('held', @token@, NULL)$$),
    ($$fence.renew_if_held('held', @token@, '-1 s')$$),
    ($$fence.renew_if_held('held', gen_random_uuid(), '1 s')$$),
    ($$fence.renew_if_held('released', @old_token@, '1 s')$$),
    -- holder_alive (strict): sessions that do not exist are not alive
    ($$fence.holder_alive(NULL, 1)$$),
    ($$fence.holder_alive(-1, -1)$$),
    ($$fence.holder_alive(0, 0)$$),
    ($$fence.holder_alive(2147483647, 9223372036854775807)$$),
    ($$fence.holder_alive(pg_backend_pid(), 0)$$),
    -- the helper behind lease_renew's SQL shell, executable by PUBLIC: it only ever raises
    ($$fence.raise_lease_lost(NULL)$$),
    ($$fence.raise_lease_lost('held')$$),
    ($$fence.raise_lease_lost('held', @old_token@)$$),
    ($$fence.raise_lease_set_lost(NULL, NULL)$$),
    ($$fence.raise_lease_set_lost(ARRAY['held', 'free'], @old_token@)$$),
    -- the versioning trigger functions, called directly
    ($$fence.check_version()$$),
    ($$fence.bump_version()$$)
) AS c(expr);

-- Block "role": an ordinary role without any grant on the target, aiming at what it may not touch.
INSERT INTO cases (block, expr) SELECT 'role', expr FROM (VALUES
    ($$fence.lease_revoke('held')$$),
    ($$fence.lease_renew('held', gen_random_uuid(), '1 hour')$$),
    ($$fence.lease_release('held', gen_random_uuid())$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.fenced_update('held', @fence@, 'fence.lease_state', '{"fence": 1}', '{"key": "held"}')$$),
    ($$fence.fenced_update('held', @fence@, 'fence.sweeper_stats', '{"total_swept": 0}', '{"one": true}')$$),
    ($$fence.fenced_update('held', @fence@, 'pg_authid', '{"rolsuper": true}', '{"rolname": "fence_hostile"}')$$),
    ($$fence.fenced_write('fence.lease_state', 'fence', 100, '{"owner": "me"}', '{"key": "held"}')$$),
    ($$fence.fenced_write('fence.sweeper_stats', 'last_swept', 100, '{"total_swept": 0}', '{"one": true}')$$),
    ($$fence.versioned_update('fence.lease_state', 'fence', @fence@, '{"owner": "me"}', '{"key": "held"}')$$),
    ($$fence.update_matching('fence.lease_state'::regclass, '{"token_hash": null}', '{"key": "held"}')$$),
    ($$fence.update_versioned_row('fence.lease_state'::regclass, 'fence', @fence@, '{"owner": "me"}', '{"key": "held"}')$$),
    ($$fence.enable_versioning('target')$$),
    ($$fence.enable_versioning('fence.lease_state', 'fence')$$),
    ($$fence.disable_versioning('fence.lease_state')$$)
) AS c(expr);

-- Block "read-only": arguments at the edge of what is accepted (and odd but valid keys) get past
-- every argument check and reach the read-only check, 25006, so nothing is written.
INSERT INTO cases (block, expr) SELECT 'read-only', expr FROM (VALUES
    ($$fence.lease_acquire(repeat('k', 512), '1 s')$$),
    ($$fence.lease_acquire(repeat('é', 256), '1 s')$$),
    ($$fence.lease_acquire(' ', '1 s')$$),
    ($$fence.lease_acquire('k', '1 s', durable => false)$$),
    ($$fence.lease_acquire(E'\n\t', '1 s')$$),
    ($$fence.lease_acquire('k''; DELETE FROM fence.lease_state; --', '1 s')$$),
    ($$fence.lease_acquire('k', '1 microsecond')$$),
    ($$fence.lease_acquire('k', '1 day')$$),
    ($$fence.lease_acquire('k', '-1 mon 31 days')$$),
    ($$fence.lease_acquire('k', '1 s', repeat('o', 256))$$),
    ($$fence.lease_acquire('k', '1 s', wait => '100 years')$$),
    -- (the limit on wait is 36,600 days: '101 years' is 36,360 days in interval arithmetic)
    ($$fence.lease_acquire('k', '1 s', wait => '101 years')$$),
    ($$fence.lease_acquire('k', '1 s', session_bound => true)$$),
    ($$fence.lease_renew('held', @token@, '1 day')$$),
    ($$fence.lease_release('held', @token@)$$),
    ($$fence.lease_revoke('held')$$),
    ($$fence.sweep()$$),
    -- (with or without preload alike: the package tests preload pg_fence, this suite does not)
    ($$fence.stats_reset() IS NOT NULL$$),
    ($$(SELECT count(*) FROM fence.stats_values())$$),
    ($$fence.fenced_update('held', @fence@, 'target', '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.fenced_write('target', 'fence', 9, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.versioned_update('target', 'version', 1, '{"status": "x"}', '{"id": 1}')$$),
    ($$fence.enable_versioning('target')$$),
    -- (and which edition answers, read-only or not: 'extension', or the SQL edition's 'sql')
    ($$fence.edition() IN ('extension', 'sql')$$)
) AS c(expr);

SELECT run_block('args', :held_fence, :'held_token', :'old_token');

SET ROLE fence_hostile;
SELECT run_block('role', :held_fence, :'held_token', :'old_token');
RESET ROLE;

BEGIN READ ONLY;
SELECT run_block('read-only', :held_fence, :'held_token', :'old_token');
COMMIT;

\pset format unaligned
\pset fieldsep ' | '
SELECT c.n, c.block, c.expr AS call, named(r.outcome, :'fences') AS outcome, r.same_rows, r.same_locks
  FROM cases c JOIN results r USING (n) ORDER BY c.n;
\pset format aligned

-- The SQLSTATEs seen, per block.
SELECT c.block, CASE WHEN r.outcome LIKE 'ok:%' THEN 'ok' ELSE substr(r.outcome, 1, 5) END AS sqlstate,
       count(*)
  FROM cases c JOIN results r USING (n)
 GROUP BY 1, 2 ORDER BY 1, 2;

-- Every function of schema fence has cases (none listed here).
SELECT p.proname AS function_without_cases
  FROM pg_proc p
 WHERE p.pronamespace = 'fence'::regnamespace
   AND NOT EXISTS (SELECT FROM cases c WHERE c.expr LIKE '%fence.' || p.proname || '(%')
 ORDER BY 1;

-- Every case left the rows as they were, and so did all of them together; no case ended in an
-- internal error (class XX). One case keeps a lock, as it must: a fenced_update whose guard passed
-- (with the live fence; it matched no row) holds the key's lock until its transaction ends, so that
-- no higher grant can commit before its write. The cases of a block share one transaction, so the
-- lock is gone once the block has run.
SELECT count(*) AS cases,
       count(*) FILTER (WHERE same_rows) AS same_rows,
       count(*) FILTER (WHERE same_locks) AS same_locks,
       count(*) FILTER (WHERE outcome LIKE 'XX%') AS internal_errors
  FROM results;
SELECT c.expr AS keeps_a_lock, named(r.outcome, :'fences') AS outcome FROM cases c JOIN results r USING (n) WHERE NOT r.same_locks;
SELECT rows_digest() = :'rows_before_all' AS all_rows_unchanged,
       my_advisory_locks() = :'locks_before_all' AS no_lock_left;
SELECT count(*) AS target_tables_left FROM pg_class WHERE relname = 'target';

-- A renewal longer than pg_fence.max_ttl is refused for the limit's sake alone: under a raised limit
-- the same renewal goes through.
SET pg_fence.max_ttl = '3d';
SELECT fence.lease_renew('held', :'held_token', '2 days') > clock_timestamp() + interval '47 hours' AS renewed_under_raised_limit;
RESET pg_fence.max_ttl;

-- The full error, with its DETAIL and HINT, as a client sees it. (Without CONTEXT: which functions
-- raised it is the edition's own, C in the extension, PL/pgSQL in the SQL edition.)
\set VERBOSITY default
\set SHOW_CONTEXT never
SELECT fence.lease_acquire('k', '0 s');
SELECT fence.lease_renew('held', gen_random_uuid(), '1 s');
SELECT fence.lease_acquire(NULL, '1 s');

-- The checks can fail: a call that does write (and keeps the key's lock until it commits) is caught.
SELECT * FROM run_case($$(fence.lease_acquire('control', '1 hour', 'control')).fence IS NOT NULL$$);

DROP TABLE target CASCADE;
DROP SEQUENCE target_seq;
DROP DOMAIN positive, required;
DROP TABLE cases, results, case_value;
DROP FUNCTION run_block(text, bigint, uuid, uuid);
DROP FUNCTION run_case(text);
DROP FUNCTION rows_digest();
DROP FUNCTION my_advisory_locks();
DROP ROLE fence_hostile;
DROP EXTENSION pg_fence;
