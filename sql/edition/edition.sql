-- Which edition answers (sql/leases.sql has the extension's): this one, in SQL and PL/pgSQL.
CREATE OR REPLACE FUNCTION fence.edition() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 'sql'::text $$;
