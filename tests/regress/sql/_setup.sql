-- Runs first (pg_test/run-tests runs the files in name order). try(sql) runs a statement and shows
-- its outcome, 'ok' or 'SQLSTATE: message', so the expected files pin each error's SQLSTATE.
CREATE FUNCTION try(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;
