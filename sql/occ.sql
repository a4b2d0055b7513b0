-- Optimistic concurrency: versioned_update (its core is in src/writes/occ.rs) and a trigger that makes every
-- UPDATE of a table bump its version column, so a writer that forgot the check cannot silently
-- overwrite a newer row.

CREATE FUNCTION fence.versioned_update(target regclass, version_column name, expected_version bigint,
                                       changes jsonb, filter jsonb)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$
    SELECT fence.update_versioned_row(target::pg_catalog.oid, version_column::pg_catalog.text, expected_version,
                                      changes, filter)
$$;

-- The versioning triggers; TG_ARGV[0] names the version column. Triggers fire in name order:
-- pg_fence_versioning_1_check runs only for an UPDATE whose SET list names the version column, and
-- refuses any value but old + 1 (even the old value itself: a writer that read an older version and
-- sets "its read + 1" must not pass); pg_fence_versioning_2_bump then gives old + 1 to an UPDATE that
-- left the version alone.
CREATE FUNCTION fence.check_version()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    old_version bigint := to_jsonb(OLD) ->> TG_ARGV[0];
    new_version bigint := to_jsonb(NEW) ->> TG_ARGV[0];
BEGIN
    IF new_version IS DISTINCT FROM coalesce(old_version, 0) + 1 THEN
        RAISE EXCEPTION 'version conflict on %: % must go from % to %, not %',
                TG_TABLE_NAME, TG_ARGV[0], old_version, coalesce(old_version, 0) + 1, new_version
            USING ERRCODE = '40001',
                  HINT = 'Another writer changed the row first: read it again and retry.';
    END IF;
    RETURN NEW;
END
$$;

CREATE FUNCTION fence.bump_version()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    old_version bigint := to_jsonb(OLD) ->> TG_ARGV[0];
BEGIN
    IF to_jsonb(NEW) -> TG_ARGV[0] IS NOT DISTINCT FROM to_jsonb(OLD) -> TG_ARGV[0] THEN
        NEW := jsonb_populate_record(NEW, jsonb_build_object(TG_ARGV[0], coalesce(old_version, 0) + 1));
    END IF;
    RETURN NEW;
END
$$;

-- A regclass given as a bare number may name no relation at all.
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

-- enable_versioning and disable_versioning pin search_path: they run DDL, often as a table owner
-- or superuser, and a look-alike format() or operator earlier on the caller's path must not run.
CREATE FUNCTION fence.enable_versioning(target regclass, version_column name DEFAULT 'version')
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

CREATE FUNCTION fence.disable_versioning(target regclass)
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
