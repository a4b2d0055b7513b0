-- Optimistic concurrency: versioned_update (its core is in src/occ.rs) and a trigger that makes every
-- UPDATE of a table bump its version column, so a writer that forgot the check cannot silently
-- overwrite a newer row.

CREATE FUNCTION fence.versioned_update(target regclass, version_column name, expected_version bigint,
                                       changes jsonb, filter jsonb)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$
    SELECT fence.update_versioned_row(target::oid, version_column::text, expected_version, changes, filter)
$$;

-- Trigger function: TG_ARGV[0] names the version column. An UPDATE that leaves the version alone gets
-- old + 1; one that sets it to old + 1 (as versioned_update does) passes; any other value is a
-- conflict with a newer write, refused with 40001 like versioned_update's mismatch.
CREATE FUNCTION fence.bump_version()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    column_name text := TG_ARGV[0];
    old_version bigint := to_jsonb(OLD) ->> column_name;
    new_version bigint := to_jsonb(NEW) ->> column_name;
BEGIN
    IF new_version IS NOT DISTINCT FROM old_version THEN
        NEW := jsonb_populate_record(NEW, jsonb_build_object(column_name, coalesce(old_version, 0) + 1));
    ELSIF new_version IS DISTINCT FROM coalesce(old_version, 0) + 1 THEN
        RAISE EXCEPTION 'version conflict on %: % must go from % to %, not %',
                TG_TABLE_NAME, column_name, old_version, coalesce(old_version, 0) + 1, new_version
            USING ERRCODE = '40001',
                  HINT = 'Another writer changed the row first: read it again and retry.';
    END IF;
    RETURN NEW;
END
$$;

CREATE FUNCTION fence.enable_versioning(target regclass, version_column name DEFAULT 'version')
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    column_type regtype;
BEGIN
    IF target IS NULL OR version_column IS NULL THEN
        RAISE EXCEPTION 'target and version_column must not be NULL' USING ERRCODE = '22004';
    END IF;
    SELECT atttypid::regtype INTO column_type
      FROM pg_catalog.pg_attribute
     WHERE attrelid = target AND attname = version_column AND attnum > 0 AND NOT attisdropped;
    IF column_type IS NULL THEN
        RAISE EXCEPTION 'column "%" of % does not exist', version_column, target
            USING ERRCODE = '42703', HINT = 'Add a bigint version column first: ALTER TABLE ... ADD COLUMN version bigint NOT NULL DEFAULT 1.';
    END IF;
    IF column_type NOT IN ('smallint'::regtype, 'integer'::regtype, 'bigint'::regtype, 'numeric'::regtype) THEN
        RAISE EXCEPTION 'version column "%" of % is %, not an integer type', version_column, target, column_type
            USING ERRCODE = '42804', HINT = 'Use a bigint column.';
    END IF;
    EXECUTE format('DROP TRIGGER IF EXISTS pg_fence_versioning ON %s', target);
    EXECUTE format('CREATE TRIGGER pg_fence_versioning BEFORE UPDATE ON %s FOR EACH ROW '
                   'EXECUTE FUNCTION fence.bump_version(%L)', target, version_column);
END
$$;

CREATE FUNCTION fence.disable_versioning(target regclass)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF target IS NULL THEN
        RAISE EXCEPTION 'target must not be NULL' USING ERRCODE = '22004';
    END IF;
    EXECUTE format('DROP TRIGGER IF EXISTS pg_fence_versioning ON %s', target);
END
$$;
