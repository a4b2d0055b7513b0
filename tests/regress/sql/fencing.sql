-- Fenced writes as a psql user sees them: fence_guard, fenced_update, fenced_write. The fences of
-- grants differ from run to run, so messages show them by name (named() of _setup.sql).
CREATE EXTENSION pg_fence;

CREATE TABLE invoices (id int PRIMARY KEY, status text NOT NULL, amount numeric, paid_on date,
                       fence bigint, tags text[]);
INSERT INTO invoices VALUES (42, 'open', 100, NULL, NULL, '{}'), (43, 'open', 200, NULL, NULL, '{}');

-- The holder of invoice:42 writes under its fence.
SELECT fence, token FROM fence.lease_acquire('invoice:42', '1 minute', 'worker-a') \gset a_
SELECT fence.fence_guard('invoice:42', :a_fence);
UPDATE invoices SET status = 'sent' WHERE id = 42 AND fence.fence_guard('invoice:42', :a_fence);
SELECT fence.fenced_update('invoice:42', :a_fence, 'invoices',
                           '{"status": "paid", "amount": "120.50", "paid_on": "2026-11-29", "tags": ["a", "b"]}',
                           '{"id": 42}') AS rows_updated;
SELECT * FROM invoices ORDER BY id;
-- No row matches: 0 rows, no error.
SELECT fence.fenced_update('invoice:42', :a_fence, 'invoices', '{"status": "x"}', '{"id": 999}') AS rows_updated;

-- The lease ends and worker-b takes over: worker-a's fence is stale everywhere.
SELECT fence.lease_release('invoice:42', :'a_token');
SELECT (fence.lease_acquire('invoice:42', '1 minute', 'worker-b')).fence AS b_fence \gset
SELECT :b_fence > :a_fence AS b_fence_is_higher;
SELECT jsonb_build_object('a_fence', :a_fence, 'b_fence', :b_fence, 'b_fence + 1', :b_fence + 1) AS fences \gset
SELECT try(format('SELECT fence.fence_guard(%L, %s)', 'invoice:42', :a_fence), :'fences') AS stale_guard;
SELECT try(format($$UPDATE invoices SET status = 'stale' WHERE id = 42 AND fence.fence_guard(%L, %s)$$, 'invoice:42', :a_fence), :'fences') AS stale_update;
SELECT try(format($$SELECT fence.fenced_update(%L, %s, 'invoices', '{"status": "stale"}', '{"id": 42}')$$, 'invoice:42', :a_fence), :'fences') AS stale_fenced_update;
SELECT fence.fenced_update('invoice:42', :b_fence, 'invoices', '{"status": "refunded"}', '{"id": 42}') AS b_rows;
-- A fence from the future, or for a key never granted, is stale too.
SELECT try(format('SELECT fence.fence_guard(%L, %s)', 'invoice:42', :b_fence + 1), :'fences') AS future_fence;
SELECT try($$SELECT fence.fence_guard('never-granted', 1)$$) AS unknown_key;
SELECT id, status FROM invoices ORDER BY id;

-- fenced_write: the row remembers the highest fence it accepted (tokens from anywhere).
SELECT fence.fenced_write('invoices', 'fence', 7, '{"status": "w7"}', '{"id": 43}') AS w7;
SELECT fence.fenced_write('invoices', 'fence', 7, '{"status": "w7 again"}', '{"id": 43}') AS w7_again;
SELECT try($$SELECT fence.fenced_write('invoices', 'fence', 5, '{"status": "w5"}', '{"id": 43}')$$) AS w5;
SELECT fence.fenced_write('invoices', 'fence', 9, '{"status": "w9"}', '{"id": 43}') AS w9;
-- A stale token anywhere among the matching rows refuses the whole write: row 42 (no fence yet)
-- would take fence 8, row 43 holds 9, so neither changes.
UPDATE invoices SET status = 'open' WHERE id = 42;
ALTER TABLE invoices ADD COLUMN batch int DEFAULT 1;
SELECT try($$SELECT fence.fenced_write('invoices', 'fence', 8, '{"amount": 1}', '{"batch": 1}')$$) AS w8;
SELECT id, status, amount, fence FROM invoices ORDER BY id;
ALTER TABLE invoices DROP COLUMN batch;

-- Values keep their precision and type; odd column names and NOT NULL domains are no obstacle.
CREATE DOMAIN email AS text NOT NULL CHECK (VALUE LIKE '%@%');
CREATE TABLE "Odd Table" (id int PRIMARY KEY, "x""; DROP TABLE invoices; --" numeric, mail email, note text);
INSERT INTO "Odd Table" VALUES (1, 0, 'a@example.com', NULL);
SELECT fence.fenced_update('invoice:42', :b_fence, '"Odd Table"',
                           '{"x\"; DROP TABLE invoices; --": 123456789012345678901.50, "note": "kept"}',
                           '{"id": 1}') AS odd_rows;
SELECT * FROM "Odd Table";
SELECT try(format($$SELECT fence.fenced_update('invoice:42', %s, '"Odd Table"', '{"mail": null}', '{"id": 1}')$$, :b_fence)) AS null_into_domain;
DROP TABLE "Odd Table";
DROP DOMAIN email;

-- A snapshot of the table, to show what the caller's privileges let through below (bad input is
-- hostile.sql's, which checks every table unchanged after each case).
CREATE TABLE snapshot AS SELECT * FROM invoices;

-- Writes run with the caller's privileges: table grants and row-level security apply.
CREATE ROLE fence_clerk IN ROLE fence_user;
GRANT SELECT ON invoices TO fence_clerk;
SET ROLE fence_clerk;
SELECT try(format($$SELECT fence.fenced_update('invoice:42', %s, 'invoices', '{"status": "x"}', '{"id": 42}')$$, :b_fence)) AS without_update_grant;
SELECT try($$SELECT fence.fenced_write('invoices', 'fence', 100, '{"status": "x"}', '{"id": 43}')$$) AS write_without_grant;
RESET ROLE;
GRANT UPDATE ON invoices TO fence_clerk;
ALTER TABLE invoices ENABLE ROW LEVEL SECURITY;
CREATE POLICY clerk_sees_43 ON invoices TO fence_clerk USING (id = 43);
SET ROLE fence_clerk;
SELECT fence.fenced_update('invoice:42', :b_fence, 'invoices', '{"status": "hidden"}', '{"id": 42}') AS hidden_row;
SELECT fence.fenced_update('invoice:42', :b_fence, 'invoices', '{"status": "visible"}', '{"id": 43}') AS visible_row;
RESET ROLE;
SELECT id, status FROM invoices ORDER BY id;
SELECT count(*) AS changed_rows FROM (SELECT * FROM invoices EXCEPT SELECT * FROM snapshot) changed;

-- jsonb arguments as they come from a table: short (1-byte header), compressed inline, and stored
-- out of line (TOAST); pg_fence reads them in their binary form.
CREATE TABLE docs (id int PRIMARY KEY, body text, tags jsonb);
INSERT INTO docs VALUES (1, '', '[]');
CREATE TABLE doc_changes (id int PRIMARY KEY, changes jsonb);
INSERT INTO doc_changes VALUES
    (1, '{"body": "short"}'),
    (2, jsonb_build_object('body', repeat('abc', 3000), 'tags', '[1, 2, 3]'::jsonb)),
    (3, jsonb_build_object('body', (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 2000) g)));
SELECT id, pg_column_size(changes) < octet_length(changes::text) AS compressed,
       pg_column_size(changes) > 8000 AS out_of_line
  FROM doc_changes ORDER BY id;
-- Each passed straight from the table scan, as stored.
SELECT fence.fenced_update('invoice:42', :b_fence, 'docs', changes, '{"id": 1}') AS written FROM doc_changes WHERE id = 1;
SELECT length(body), tags FROM docs;
SELECT fence.fenced_update('invoice:42', :b_fence, 'docs', changes, '{"id": 1}') AS written FROM doc_changes WHERE id = 2;
SELECT length(body), tags FROM docs;
SELECT fence.fenced_update('invoice:42', :b_fence, 'docs', changes, '{"id": 1}') AS written FROM doc_changes WHERE id = 3;
SELECT length(body), tags FROM docs;
DROP TABLE docs, doc_changes;

-- A fence a grant hands out does not fit an integer column (it is a clock reading in microseconds,
-- far above 2^31): fenced_write into one fails with 22003 and writes nothing. A bigint column
-- takes it.
CREATE TABLE narrow (id int PRIMARY KEY, status text, fence integer, wide_fence bigint);
INSERT INTO narrow VALUES (1, 'open', NULL, NULL), (2, 'open', 5, NULL);
SELECT (fence.lease_acquire('narrow', '1 minute')).fence AS n_fence \gset
SELECT try(format($$SELECT fence.fenced_write('narrow', 'fence', %s, '{"status": "written"}', '{"id": 1}')$$, :n_fence)) AS into_integer;
SELECT try(format($$SELECT fence.fenced_write('narrow', 'fence', %s, '{"status": "written"}', '{"id": 2}')$$, :n_fence)) AS into_integer_holding_a_fence;
SELECT * FROM narrow ORDER BY id;
SELECT fence.fenced_write('narrow', 'wide_fence', :n_fence, '{"status": "written"}', '{"id": 1}') AS into_bigint;
SELECT id, status, fence, wide_fence = :n_fence AS holds_the_grant_s_fence FROM narrow ORDER BY id;
DROP TABLE narrow;

DROP TABLE invoices CASCADE;
DROP TABLE snapshot;
DROP ROLE fence_clerk;
DROP EXTENSION pg_fence;
