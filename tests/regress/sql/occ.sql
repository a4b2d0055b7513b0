-- Optimistic concurrency: versioned_update, and the versioning trigger.
CREATE EXTENSION pg_fence;

CREATE TABLE docs (id int PRIMARY KEY, body text, owner_id int, version bigint NOT NULL DEFAULT 1);
INSERT INTO docs VALUES (1, 'draft', 7, 1), (2, 'other', 7, 1), (3, 'third', 8, 1);

SELECT fence.versioned_update('docs', 'version', 1, '{"body": "edited"}', '{"id": 1}') AS new_version;
-- A writer that read version 1 is too late: 40001, so a client retry loop applies.
SELECT try($$SELECT fence.versioned_update('docs', 'version', 1, '{"body": "lost"}', '{"id": 1}')$$) AS stale_version;
SELECT fence.versioned_update('docs', 'version', 2, '{"body": "edited twice"}', '{"id": 1}') AS new_version;
SELECT try($$SELECT fence.versioned_update('docs', 'version', 1, '{"body": "x"}', '{"id": 99}')$$) AS no_row;
-- Two rows match (though only one has version 1): refused, nothing changes.
SELECT try($$SELECT fence.versioned_update('docs', 'version', 1, '{"body": "x"}', '{"owner_id": 7}')$$) AS two_rows;
SELECT try($$SELECT fence.versioned_update('docs', 'version', 1, '{"version": 5}', '{"id": 2}')$$) AS sets_version;
SELECT try($$SELECT fence.versioned_update('docs', 'body', 1, '{"owner_id": 1}', '{"id": 2}')$$) AS text_version_column;
SELECT try($$SELECT fence.versioned_update('docs', NULL, 1, '{"body": "x"}', '{"id": 2}')$$) AS null_column;
SELECT try($$SELECT fence.versioned_update('docs', 'version', NULL, '{"body": "x"}', '{"id": 2}')$$) AS null_version;
SELECT try($$SELECT fence.versioned_update('docs', 'nope', 1, '{"body": "x"}', '{"id": 2}')$$) AS unknown_column;
SELECT * FROM docs ORDER BY id;

-- With versioning on, every UPDATE bumps the version, and one that sets it wrongly is refused.
SELECT fence.enable_versioning('docs');
UPDATE docs SET body = 'plain update' WHERE id = 2;
UPDATE docs SET body = 'set to old + 1', version = version + 1 WHERE id = 2;
SELECT try($$UPDATE docs SET body = 'stale writer', version = 2 WHERE id = 2$$) AS stale_writer;
SELECT try($$UPDATE docs SET version = 100 WHERE id = 3$$) AS jump_ahead;
-- A writer that read an older version and sets "its read + 1", which is the current version.
SELECT try($$UPDATE docs SET body = 'read + 1', version = 3 WHERE id = 2$$) AS stale_read_plus_one;
SELECT fence.versioned_update('docs', 'version', 3, '{"body": "versioned"}', '{"id": 2}') AS new_version;
SELECT * FROM docs ORDER BY id;
SELECT fence.disable_versioning('docs');
UPDATE docs SET body = 'no trigger' WHERE id = 3;
SELECT id, version FROM docs WHERE id = 3;

SELECT try($$SELECT fence.enable_versioning('docs', 'nope')$$) AS unknown_column;
SELECT try($$SELECT fence.enable_versioning('docs', 'body')$$) AS text_column;
SELECT try($$SELECT fence.enable_versioning(NULL)$$) AS null_table;
SELECT try($$SELECT fence.enable_versioning('no_such_table')$$) AS no_table;

-- Like any UPDATE the caller makes: table privileges and row-level security apply.
CREATE ROLE occ_reader IN ROLE fence_user;
GRANT SELECT ON docs TO occ_reader;
SET ROLE occ_reader;
SELECT try($$SELECT fence.versioned_update('docs', 'version', 2, '{"body": "x"}', '{"id": 3}')$$) AS without_update_grant;
RESET ROLE;
GRANT UPDATE ON docs TO occ_reader;
ALTER TABLE docs ENABLE ROW LEVEL SECURITY;
CREATE POLICY only_doc_1 ON docs TO occ_reader USING (id = 1);
SET ROLE occ_reader;
SELECT try($$SELECT fence.versioned_update('docs', 'version', 2, '{"body": "x"}', '{"id": 3}')$$) AS hidden_by_policy;
RESET ROLE;
SELECT id, body, version FROM docs ORDER BY id;

DROP TABLE docs;
DROP ROLE occ_reader;
DROP EXTENSION pg_fence;
