-- The lease lifecycle as a psql user sees it. Fences differ from run to run (_setup.sql): the
-- output shows how they compare, never their values.
CREATE EXTENSION pg_fence;

-- A first grant gets a token and a fence no lower than the clock (in microseconds) at the call;
-- the key is then held.
SELECT clock_us() AS before_us \gset
SELECT key, owner, fence, token IS NOT NULL AS has_token, expires_at > acquired_at AS ends_later
  FROM fence.lease_acquire('migration', '30 seconds', 'worker-a') \gset a_
SELECT :'a_key' AS key, :'a_owner' AS owner, :a_fence >= :before_us AS fence_from_the_clock,
       :'a_has_token' AS has_token;
SELECT :'a_ends_later' AS ends_later;
SELECT (fence.lease_acquire('migration', '30 seconds', 'worker-b')).fence AS second_acquire;
SELECT fence.current_fence('migration') = :a_fence AS current_is_granted, fence.current_fence('never-granted');
SELECT key, owner, fence = :a_fence AS granted_fence, live FROM fence.leases;

-- Release with a wrong token changes nothing.
SELECT fence.lease_release('migration', gen_random_uuid()) AS wrong_token;
SELECT owner, fence = :a_fence AS same_fence, live FROM fence.leases;

-- With the right token, release ends the lease, once; renew is then refused.
SELECT fence.lease_acquire('report', '30 seconds', 'worker-a') AS l \gset
SELECT (:'l'::fence.lease).fence AS report_fence \gset
SELECT fence.lease_renew('report', (:'l'::fence.lease).token, '1 minute') > clock_timestamp() + interval '59 seconds' AS renewed;
SELECT fence.lease_release('report', (:'l'::fence.lease).token) AS released;
SELECT fence.lease_release('report', (:'l'::fence.lease).token) AS released_again;
SELECT try(format('SELECT fence.lease_renew(%L, %L, %L)', 'report', (:'l'::fence.lease).token, '1 minute')) AS renew_after_release;
SELECT owner, fence = :report_fence AS same_fence, live FROM fence.leases WHERE key = 'report';
SELECT (fence.lease_acquire('report', '30 seconds', 'worker-b')).fence AS next_fence \gset
SELECT :next_fence > :report_fence AS next_is_higher, fence.current_fence('report') = :next_fence AS current_is_next;

-- Expiry: no sweeper needed, the next acquirer takes over at once with a higher fence, and the
-- old holder can neither renew nor release.
SELECT fence.lease_acquire('short', '50 milliseconds', 'worker-a') AS s \gset
SELECT pg_sleep(0.1);
SELECT live FROM fence.leases WHERE key = 'short';
SELECT (fence.lease_acquire('short', '30 seconds', 'worker-b')).fence AS takeover_fence \gset
SELECT :takeover_fence > (:'s'::fence.lease).fence AS takeover_is_higher;
SELECT try(format('SELECT fence.lease_renew(%L, %L, %L)', 'short', (:'s'::fence.lease).token, '1 minute')) AS old_holder_renews;
SELECT fence.lease_release('short', (:'s'::fence.lease).token) AS old_holder_releases;
SELECT owner, fence = :takeover_fence AS takeover_fence, live FROM fence.leases WHERE key = 'short';

-- A rolled-back acquire grants nothing: the key has no fence afterwards, and its next grant is a
-- first grant. And rolled back after a committed grant, it leaves that grant's fence current, and
-- the next grant above it.
BEGIN;
SELECT (fence.lease_acquire('rolled-back', '30 seconds')).fence IS NOT NULL AS granted_then_rolled_back;
ROLLBACK;
SELECT fence.current_fence('rolled-back');
SELECT clock_us() AS before_us \gset
SELECT fence, token FROM fence.lease_acquire('rolled-back', '30 seconds') \gset rb_
SELECT :rb_fence >= :before_us AS fence_from_the_clock, fence.current_fence('rolled-back') = :rb_fence AS current_is_granted;
SELECT fence.lease_release('rolled-back', :'rb_token') AS released;
BEGIN;
SELECT (fence.lease_acquire('rolled-back', '30 seconds')).fence > :rb_fence AS granted_then_rolled_back;
ROLLBACK;
SELECT fence.current_fence('rolled-back') = :rb_fence AS committed_fence_is_current;
SELECT (fence.lease_acquire('rolled-back', '30 seconds')).fence > :rb_fence AS next_is_higher;

-- Read-only transactions are refused before anything happens.
BEGIN READ ONLY;
SELECT try($$SELECT fence.lease_acquire('ro', '30 seconds')$$) AS read_only_acquire;
COMMIT;
SELECT fence.current_fence('ro');

-- Reads, and calls that change nothing, take no transaction id: they write no commit record and
-- work in read-only transactions.
BEGIN READ ONLY;
SELECT fence.current_fence('migration') = :a_fence AS read_only_current_fence;
SELECT live AS migration_live FROM fence.leases WHERE key = 'migration';
COMMIT;
BEGIN;
SELECT fence.current_fence('migration') IS NOT NULL AS known,
       fence.lease_acquire('migration', '1 minute') IS NULL AS refused,
       fence.lease_acquire('migration', '1 minute', wait => '1 ms') IS NULL AS refused_after_waiting,
       fence.lease_release('migration', gen_random_uuid()) AS released_with_a_wrong_token;
SELECT txid_current_if_assigned() IS NULL AS no_transaction_id;
COMMIT;

-- Session-bound leases: the view shows the holder's backend, and the lease is live while it is.
SELECT (fence.lease_acquire('bound', '1 minute', session_bound => true)).fence AS bound_fence \gset
SELECT key, session_pid = pg_backend_pid() AS this_backend, live FROM fence.leases WHERE key = 'bound';
SELECT fence.lease_acquire('bound', '1 minute') IS NULL AS held_by_this_session;
-- A row edited by hand into a half-set session pair counts as dead (never as "unknown").
UPDATE fence.lease_state SET session_pid = NULL WHERE key = 'bound';
SELECT live FROM fence.leases WHERE key = 'bound';
SELECT (fence.lease_acquire('bound', '1 minute')).fence > :bound_fence AS taken_over_higher;

-- A transaction that already changed a key does not wait for itself (statement_timeout would show it).
BEGIN;
SET LOCAL statement_timeout = '2s';
SELECT (fence.lease_acquire('mine', '1 minute')).fence IS NOT NULL AS granted;
SELECT fence.lease_acquire('mine', '1 minute', wait => '1 hour') IS NULL AS refused_at_once;
COMMIT;

-- Waiting needs READ COMMITTED: a snapshot-holding transaction would never see the key freed.
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT try($$SELECT fence.lease_acquire('mine', '1 minute', wait => '1 second')$$) AS repeatable_read_wait;
SELECT fence.lease_acquire('mine', '1 minute') IS NULL AS repeatable_read_without_wait;
COMMIT;

DROP EXTENSION pg_fence;
