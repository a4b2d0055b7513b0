-- Runs first (pg_test/run-tests runs the files in name order). try(sql) runs a statement and shows
-- its outcome, 'ok' or 'SQLSTATE: message', so the expected files pin each error's SQLSTATE.
CREATE FUNCTION try(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- A fence is the server's clock in microseconds at its grant (or its key's previous fence + 1),
-- so its value changes from run to run, and the expected files must not show it. named(shown,
-- fences) writes each fence of `fences` (a jsonb object of names to fences) that `shown` contains
-- as <name>: an output then still pins which fence a message quotes.
CREATE FUNCTION named(shown text, fences jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    name text;
    fence text;
BEGIN
    FOR name, fence IN SELECT key, value FROM jsonb_each_text(fences) LOOP
        shown := regexp_replace(shown, '(?<![0-9])' || fence || '(?![0-9])', '<' || name || '>', 'g');
    END LOOP;
    RETURN shown;
END $$;

-- try(), with the fences its outcome quotes named.
CREATE FUNCTION try(sql text, fences jsonb) RETURNS text
LANGUAGE sql AS $$ SELECT public.named(public.try(sql), fences) $$;

-- The same, with the error's DETAIL and HINT, which try() leaves out.
CREATE FUNCTION try_in_full(sql text, fences jsonb) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    detail text;
    hint text;
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
    RETURN public.named(concat_ws(E'\n', SQLSTATE || ': ' || SQLERRM, 'DETAIL: ' || nullif(detail, ''),
                                  'HINT: ' || nullif(hint, '')), fences);
END $$;

-- The server's clock in microseconds since 1970, as a fence reads it: no first grant made after
-- this reading gets a lower fence.
CREATE FUNCTION clock_us() RETURNS bigint
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$ SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint $$;
