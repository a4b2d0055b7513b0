-- The pg_fence story in one psql script: two clients, one key, a holder that stalls past its TTL.
-- Each \connect is a new session; application_name becomes the lease owner.
\set ON_ERROR_STOP 0
\set VERBOSITY default
\pset footer off

CREATE EXTENSION pg_fence;

\echo
\echo '== 1. Client A acquires "nightly-report" for 2 seconds: it gets a fence above any the key had before.'
\connect -reuse-previous=on 'dbname=postgres application_name=client-a'
SELECT fence, token, expires_at FROM fence.lease_acquire('nightly-report', '2 seconds') \gset a_
SELECT key, owner, fence, live FROM fence.leases WHERE key = 'nightly-report';

\echo '== 2. Client B tries the same key while A holds it: refused (NULL), no fence spent.'
\connect -reuse-previous=on 'dbname=postgres application_name=client-b'
SELECT fence.lease_acquire('nightly-report', '2 seconds') IS NULL AS refused;

\echo '== 3. Client A stalls (a GC pause, SIGSTOP, a slow network) for 2.5 s. Its lease expires.'
SELECT pg_sleep(2.5);
SELECT key, owner, fence, live FROM fence.leases WHERE key = 'nightly-report';

\echo '== 4. Client B takes over at once, no sweeper needed, with a higher fence.'
SELECT fence, token FROM fence.lease_acquire('nightly-report', '30 seconds') \gset b_
SELECT :b_fence AS b_fence, :a_fence AS a_fence, :b_fence > :a_fence AS higher;

\echo '== 5. Client A wakes up and tries to renew: lease lost (SQLSTATE PF001).'
\connect -reuse-previous=on 'dbname=postgres application_name=client-a'
SELECT fence.lease_renew('nightly-report', :'a_token', '2 seconds');
\echo 'SQLSTATE:' :LAST_ERROR_SQLSTATE

\echo '== 6. Client A releases, to be safe: false, and B is untouched.'
SELECT fence.lease_release('nightly-report', :'a_token') AS released;
SELECT key, owner, fence, live FROM fence.leases WHERE key = 'nightly-report';

\echo '== 7. Client B finishes and releases; the next grant of the key will get a higher fence still.'
\connect -reuse-previous=on 'dbname=postgres application_name=client-b'
SELECT fence.lease_release('nightly-report', :'b_token') AS released;
SELECT fence.current_fence('nightly-report') AS last_fence_granted;
