-- Fencing your writes: Kleppmann's pause, in one psql script. Client A holds the lease on invoice 42,
-- stalls past its TTL; client B takes over and writes; A wakes up and writes with its old fence:
-- refused by the database itself, and B's write stands.
\set ON_ERROR_STOP 0
\set VERBOSITY default
\pset footer off

SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_fence;
DROP TABLE IF EXISTS invoices;
RESET client_min_messages;
CREATE TABLE invoices (id int PRIMARY KEY, status text NOT NULL, updated_by text);
INSERT INTO invoices VALUES (42, 'open', NULL);

\echo
\echo '== 1. Client A acquires invoice:42 for 2 seconds and starts working.'
\connect -reuse-previous=on 'dbname=postgres application_name=client-a'
SELECT fence, token FROM fence.lease_acquire('invoice:42', '2 seconds') \gset a_
SELECT :a_fence AS a_fence;

\echo '== 2. A pauses (GC, SIGSTOP, a slow network) for 2.5 s; its lease expires.'
SELECT pg_sleep(2.5);

\echo '== 3. Client B takes over with a higher fence and writes under it.'
\connect -reuse-previous=on 'dbname=postgres application_name=client-b'
SELECT fence AS b_fence FROM fence.lease_acquire('invoice:42', '30 seconds') \gset
SELECT fence.fenced_update('invoice:42', :b_fence, 'invoices',
                           '{"status": "paid", "updated_by": "client-b"}', '{"id": 42}') AS rows_written_by_b;

\echo '== 4. A wakes up and writes with its old fence: refused (SQLSTATE PF002), in every form.'
\connect -reuse-previous=on 'dbname=postgres application_name=client-a'
SELECT fence.fenced_update('invoice:42', :a_fence, 'invoices',
                           '{"status": "void", "updated_by": "client-a"}', '{"id": 42}');
\echo 'SQLSTATE:' :LAST_ERROR_SQLSTATE
UPDATE invoices SET status = 'void', updated_by = 'client-a'
 WHERE id = 42 AND fence.fence_guard('invoice:42', :a_fence);
\echo 'SQLSTATE:' :LAST_ERROR_SQLSTATE

\echo '== 5. B''s write stands.'
SELECT * FROM invoices;
