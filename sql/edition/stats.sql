-- fence.stats: the extension counts in shared memory, which an SQL edition has not. The view keeps
-- its columns, with available false and every other column NULL, as the extension shows them
-- without preload; stats_reset returns false.
CREATE FUNCTION fence.stats_values()
RETURNS TABLE (available boolean, since timestamptz, counters bigint[])
LANGUAGE sql VOLATILE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp
AS $$ SELECT false, NULL::timestamptz, NULL::bigint[] $$;

CREATE FUNCTION fence.stats_reset() RETURNS boolean
LANGUAGE sql VOLATILE STRICT PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp
AS $$ SELECT false $$;
