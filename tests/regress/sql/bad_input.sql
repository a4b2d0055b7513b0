-- Every bad argument: a clear error with its SQLSTATE, and the lease table unchanged. (Each case
-- runs in try()'s subtransaction; the calls outside try() below show the errors as a client sees them.)
CREATE EXTENSION pg_fence;

SELECT fence.lease_acquire('held', '1 hour', 'holder') AS l \gset
CREATE TABLE before AS SELECT * FROM fence.lease_state;

SELECT call, try(call) AS outcome FROM (VALUES
    ($$SELECT fence.lease_acquire(NULL, '1 s')$$),
    ($$SELECT fence.lease_acquire('', '1 s')$$),
    ($$SELECT fence.lease_acquire(repeat('k', 513), '1 s')$$),
    ($$SELECT fence.lease_acquire('k', NULL)$$),
    ($$SELECT fence.lease_acquire('k', '0 s')$$),
    ($$SELECT fence.lease_acquire('k', '-1 s')$$),
    ($$SELECT fence.lease_acquire('k', '1 day -25 hours')$$),
    ($$SELECT fence.lease_acquire('k', '1 day 1 s')$$),
    ($$SELECT fence.lease_acquire('k', '178000000 years')$$),
    ($$SELECT fence.lease_acquire('k', '1 s', repeat('o', 257))$$),
    ($$SELECT fence.lease_acquire('k', '1 s', wait => NULL)$$),
    ($$SELECT fence.lease_acquire('k', '1 s', wait => '-1 s')$$),
    ($$SELECT fence.lease_acquire('k', '1 s', wait => '1 day -25 hours')$$),
    ($$SELECT fence.lease_acquire('k', '1 s', wait => '178000000 years')$$),
    ($$SELECT fence.lease_acquire('k', '1 s', session_bound => NULL)$$),
    ($$SELECT fence.lease_acquire('held', '1 s', wait => '10 ms')$$),
    ($$SELECT fence.lease_renew(NULL, gen_random_uuid(), '1 s')$$),
    ($$SELECT fence.lease_renew('', gen_random_uuid(), '1 s')$$),
    ($$SELECT fence.lease_renew('held', NULL, '1 s')$$),
    ($$SELECT fence.lease_renew('held', gen_random_uuid(), NULL)$$),
    ($$SELECT fence.lease_renew('held', gen_random_uuid(), '0 s')$$),
    ($$SELECT fence.lease_renew('held', gen_random_uuid(), '2 days')$$),
    ($$SELECT fence.lease_renew('held', gen_random_uuid(), '1 s')$$),
    ($$SELECT fence.lease_release(NULL, gen_random_uuid())$$),
    ($$SELECT fence.lease_release(repeat('k', 600), gen_random_uuid())$$),
    ($$SELECT fence.lease_release('held', NULL)$$),
    ($$SELECT fence.current_fence(NULL)$$),
    ($$SELECT fence.current_fence('')$$),
    ($$SELECT fence.lease_acquire('k', 'not an interval')$$)
) AS cases(call);

-- The valid holder's renew with the right token still works, with the right TTL bound.
SELECT try(format('SELECT fence.lease_renew(%L, %L, %L)', 'held', (:'l'::fence.lease).token, '2 days')) AS too_long_for_holder;
SET pg_fence.max_ttl = '3d';
SELECT fence.lease_renew('held', (:'l'::fence.lease).token, '2 days') > clock_timestamp() + interval '47 hours' AS renewed_under_raised_limit;
RESET pg_fence.max_ttl;

-- Nothing but that renewal changed.
SELECT b.key, b.fence = s.fence AS same_fence, b.token_hash = s.token_hash AS same_token,
       b.owner = s.owner AS same_owner, b.acquired_at = s.acquired_at AS same_start,
       s.expires_at > b.expires_at AS renewed_later
  FROM before b JOIN fence.lease_state s USING (key);
SELECT count(*) AS rows_now FROM fence.lease_state;

-- The full error, with its HINT, as a client sees it.
\set VERBOSITY default
SELECT fence.lease_acquire('k', '0 s');
SELECT fence.lease_renew('held', gen_random_uuid(), '1 s');
SELECT fence.lease_acquire(NULL, '1 s');

DROP EXTENSION pg_fence;
DROP TABLE before;
