-- pg_fence 0.1.0 -> 0.2.0:
-- - fence.waiters(key), how many sessions wait for a key;
-- - enable_versioning / disable_versioning pin search_path and refuse an OID that names no relation
--   (fence.require_table). (The fenced and versioned writes now qualify their operators: that is in
--   the shared library, not here.)
-- Every schema change comes with an upgrade script like this one; tests/tests/upgrade.rs checks that
-- 0.1.0 plus the scripts gives exactly what a fresh CREATE EXTENSION gives.
\echo Use "ALTER EXTENSION pg_fence UPDATE TO '0.2.0'" to load this file. \quit

CREATE FUNCTION fence.waiters(key text) RETURNS integer
VOLATILE
LANGUAGE c
AS 'MODULE_PATHNAME', 'waiters_wrapper';

CREATE FUNCTION fence.require_table(target regclass)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF target IS NULL THEN
        RAISE EXCEPTION 'target must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_class WHERE oid = target) THEN
        RAISE EXCEPTION 'relation with OID % does not exist', target::oid
            USING ERRCODE = '42P01', HINT = 'Pass the table as a name, such as ''invoices'' or ''billing.invoices''.';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION fence.enable_versioning(target regclass, version_column name DEFAULT 'version')
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    column_type regtype;
BEGIN
    IF target IS NULL OR version_column IS NULL THEN
        RAISE EXCEPTION 'target and version_column must not be NULL' USING ERRCODE = '22004';
    END IF;
    PERFORM fence.require_table(target);
    SELECT atttypid::regtype INTO column_type
      FROM pg_catalog.pg_attribute
     WHERE attrelid = target AND attname = version_column AND attnum > 0 AND NOT attisdropped;
    IF column_type IS NULL THEN
        RAISE EXCEPTION 'column "%" of % does not exist', version_column, target
            USING ERRCODE = '42703', HINT = 'Add a bigint version column first: ALTER TABLE ... ADD COLUMN version bigint NOT NULL DEFAULT 1.';
    END IF;
    IF column_type NOT IN ('smallint'::regtype, 'integer'::regtype, 'bigint'::regtype) THEN
        RAISE EXCEPTION 'version column "%" of % is %, not an integer type', version_column, target, column_type
            USING ERRCODE = '42804', HINT = 'Use a bigint column.';
    END IF;
    PERFORM fence.disable_versioning(target);
    EXECUTE format('CREATE TRIGGER pg_fence_versioning_1_check BEFORE UPDATE OF %I ON %s FOR EACH ROW '
                   'EXECUTE FUNCTION fence.check_version(%L)', version_column, target, version_column);
    EXECUTE format('CREATE TRIGGER pg_fence_versioning_2_bump BEFORE UPDATE ON %s FOR EACH ROW '
                   'EXECUTE FUNCTION fence.bump_version(%L)', target, version_column);
END
$$;

CREATE OR REPLACE FUNCTION fence.disable_versioning(target regclass)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM fence.require_table(target);
    IF EXISTS (SELECT FROM pg_catalog.pg_trigger WHERE tgrelid = target AND tgname LIKE 'pg\_fence\_versioning\_%') THEN
        EXECUTE format('DROP TRIGGER IF EXISTS pg_fence_versioning_1_check ON %s', target);
        EXECUTE format('DROP TRIGGER IF EXISTS pg_fence_versioning_2_bump ON %s', target);
    END IF;
END
$$;
