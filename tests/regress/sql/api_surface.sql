-- The API's surface: every function of schema fence is either public (docs/reference.md documents
-- it) or says in its COMMENT that it is internal (sql/internal.sql). A function added without
-- either changes this list.
CREATE EXTENSION pg_fence;
SELECT p.oid::regprocedure AS function,
       coalesce(obj_description(p.oid, 'pg_proc') LIKE 'pg_fence internal:%', false) AS internal
  FROM pg_proc p
 WHERE p.pronamespace = 'fence'::regnamespace
 ORDER BY internal, p.oid::regprocedure::text COLLATE "C";

DROP EXTENSION pg_fence;
