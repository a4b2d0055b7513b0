-- Writes a stale holder cannot make (src/writes/): the guard, fenced_update, fenced_write and the
-- core of versioned_update. None is SECURITY DEFINER but fence_internal.fence_holds, which reads the
-- lease row: the writes run with the caller's privileges, so table grants and row-level security
-- apply.
--
-- Every function here pins search_path but the SQL shells of schema fence, which only call
-- fence_internal with qualified names, and pass it the caller's search_path: the caller's UPDATE
-- (built with every name qualified, operators included) runs under it, so that a domain's error
-- names the domain as the caller's own UPDATE would, and triggers see what the caller sees
-- (fence_internal.run_as_caller). Nothing else runs under it.

-- The guard's core (src/writes/fencing.rs): true when `fence` is the fence of a live holder of the
-- key, as last committed; then the guard lock of that holder's slot is held, shared, until the
-- transaction ends (a grant replacing that holder takes it exclusively, so it waits for the writes).
-- A fence that does not hold is refused before any lock is taken. The lock is the subtransaction's
-- (PostgreSQL's pg_advisory_xact_lock_shared): a ROLLBACK TO SAVEPOINT gives it back
-- (docs/sql-edition.md).
CREATE FUNCTION fence_internal.fence_holds(key text, fence bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    lock text;
BEGIN
    PERFORM fence_internal.check_key(key);
    IF fence IS NULL THEN PERFORM fence_internal.raise_null('fence'); END IF;
    IF pg_is_in_recovery() THEN
        PERFORM fence_internal.require_writable('guard a write');
    END IF;
    SELECT fence_internal.guard_lock_name(r.shared, r.slot) INTO lock
      FROM fence_internal.key_rows(key, clock_timestamp()) r WHERE r.live AND r.fence = fence_holds.fence;
    IF lock IS NULL THEN
        PERFORM fence_internal.require_latest(key, true);
        RETURN false;
    END IF;
    BEGIN
        PERFORM pg_advisory_xact_lock_shared(fence_internal.lock_id(lock, key));
        PERFORM fence_internal.require_latest(key, false);
        IF NOT EXISTS (SELECT FROM fence_internal.key_rows(key, clock_timestamp()) r
                        WHERE r.live AND r.fence = fence_holds.fence AND fence_internal.guard_lock_name(r.shared, r.slot) = lock) THEN
            RAISE SQLSTATE 'PFZ01';
        END IF;
    EXCEPTION WHEN SQLSTATE 'PFZ01' THEN
        RETURN false;
    END;
    RETURN true;
END
$$;

-- fence.fence_holds, as the extension's, is no SECURITY DEFINER: its core above is.
CREATE FUNCTION fence.fence_holds(key text, fence bigint) RETURNS boolean
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$ SELECT fence_internal.fence_holds(key, fence) $$;

CREATE FUNCTION fence_internal.raise_stale_fence(key text, fence bigint) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'fence % is stale for key "%"', coalesce(fence::text, '<NULL>'), coalesce(key, '<NULL>')
        USING ERRCODE = 'PF002',
              DETAIL = 'The key''s live lease has another fence, or no lease on it is live.',
              HINT = 'Another holder took over, or the lease expired: stop writing, and acquire the key again.';
END
$$;

CREATE FUNCTION fence.fence_guard(key text, fence bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT fence.fence_holds(key, fence) THEN
        PERFORM fence_internal.raise_stale_fence(key, fence);
    END IF;
    RETURN true;
END
$$;

-- The target of a write: a table (42P01, 42809 otherwise), by its qualified name.
CREATE FUNCTION fence_internal.target_table(function text, target oid) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    kind "char";
    name text;
BEGIN
    IF target IS NULL THEN PERFORM fence_internal.raise_null('target'); END IF;
    SELECT c.relkind, format('%I.%I', n.nspname, c.relname) INTO kind, name
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = target;
    IF name IS NULL THEN
        RAISE EXCEPTION 'relation with OID % does not exist', target
            USING ERRCODE = '42P01', HINT = 'Pass the table as a name, such as ''invoices'' or ''billing.invoices''.';
    END IF;
    IF kind NOT IN ('r', 'p') THEN
        RAISE EXCEPTION '% needs a table, and "%" is not one', function, (SELECT relname FROM pg_class WHERE oid = target)
            USING ERRCODE = '42809', HINT = 'Write to the table itself, not to a view, sequence or other relation.';
    END IF;
    RETURN name;
END
$$;

-- A column type as SQL that names the same type under any search_path: qualified by its schema but
-- for the types the grammar itself names (integer, character varying(8), numeric(10,2), ...; not
-- bpchar without a length, which format_type shows as its plain name), and
-- with the column's typmod, as jsonb_to_record is to convert a value.
CREATE FUNCTION fence_internal.type_sql(type oid, typmod integer) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN e.typname IN ('bit', 'varbit', 'bool', 'bpchar', 'float4', 'float8', 'int2', 'int4', 'int8',
                                   'interval', 'numeric', 'time', 'timetz', 'timestamp', 'timestamptz', 'varchar')
                     AND n.nspname = 'pg_catalog' AND f.shown NOT LIKE 'bpchar%'
                  OR f.shown LIKE quote_ident(n.nspname) || '.%'
                THEN f.shown
                ELSE quote_ident(n.nspname) || '.' || f.shown END
      FROM pg_type t
      JOIN pg_type e ON e.oid = CASE WHEN t.typcategory = 'A' AND t.typelem <> 0 THEN t.typelem ELSE t.oid END
      JOIN pg_namespace n ON n.oid = e.typnamespace,
           LATERAL (SELECT format_type(type, typmod) AS shown) f
     WHERE t.oid = type
$$;

-- `OPERATOR(schema.name)` of the equality operator of the type's default btree (else hash)
-- operator class, the one PostgreSQL itself means by "equal" for the type (as foreign keys use,
-- and src/writes/table_facts.rs's equality_operator; a class for another type counts when the
-- type is binary-coercible to it, implicitly): a domain's base type's, varchar's text's, an
-- array's, enum's or range's polymorphic class's (an array's only when its element type has one).
-- NULL when the type has none.
CREATE FUNCTION fence_internal.equality_operator(type oid) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    base oid := type;
    kind "char";
    category "char";
    element oid;
    found text;
BEGIN
    -- A domain's base type (a domain over a domain too).
    LOOP
        SELECT t.typtype, t.typcategory, t.typelem INTO kind, category, element FROM pg_type t WHERE t.oid = base;
        EXIT WHEN kind IS DISTINCT FROM 'd';
        SELECT t.typbasetype INTO base FROM pg_type t WHERE t.oid = base;
    END LOOP;
    IF kind IS NULL THEN
        RETURN NULL;
    END IF;
    IF category = 'A' AND element <> 0 AND fence_internal.equality_operator(element) IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT format('OPERATOR(%I.%s)', n.nspname, o.oprname) INTO found
      FROM pg_opclass c
      JOIN pg_am am ON am.oid = c.opcmethod
      JOIN pg_amop ao ON ao.amopfamily = c.opcfamily AND ao.amoplefttype = c.opcintype
                     AND ao.amoprighttype = c.opcintype
                     AND ao.amopstrategy = CASE am.amname WHEN 'btree' THEN 3 ELSE 1 END
      JOIN pg_operator o ON o.oid = ao.amopopr
      JOIN pg_namespace n ON n.oid = o.oprnamespace
     WHERE c.opcdefault AND am.amname IN ('btree', 'hash')
       AND (c.opcintype = base
            OR EXISTS (SELECT FROM pg_cast k WHERE k.castsource = base AND k.casttarget = c.opcintype
                                                AND k.castmethod = 'b' AND k.castcontext = 'i')
            OR (c.opcintype = 'anyarray'::regtype AND category = 'A' AND element <> 0)
            OR (c.opcintype = 'anyenum'::regtype AND kind = 'e')
            OR (c.opcintype = 'anyrange'::regtype AND kind = 'r')
            OR (c.opcintype = 'anymultirange'::regtype AND kind = 'm')
            OR (c.opcintype = 'record'::regtype AND kind = 'c'))
     ORDER BY am.amname = 'btree' DESC, c.opcintype = base DESC
     LIMIT 1;
    RETURN found;
END
$$;

-- The columns an object names (changes or filter), checked: (name, type as SQL, equality operator).
CREATE FUNCTION fence_internal.object_columns(target oid, table_name text, argument text, object jsonb, nulls_refused boolean)
RETURNS TABLE (name text, sql_type text, equals text)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    k text;
    v jsonb;
BEGIN
    IF object IS NULL THEN PERFORM fence_internal.raise_null(argument); END IF;
    IF jsonb_typeof(object) <> 'object' THEN
        PERFORM fence_internal.raise_invalid(format('%s must be a JSON object of column names to values, not %s', argument, object),
                                    'For example ''{"status": "paid"}''.');
    END IF;
    IF object = '{}' THEN
        PERFORM fence_internal.raise_invalid(format('%s must name at least one column', argument),
            'An empty filter would update every row of the table; name the row, e.g. ''{"id": 42}''.');
    END IF;
    FOR k, v IN SELECT * FROM jsonb_each(object) LOOP
        name := k;
        SELECT fence_internal.type_sql(a.atttypid, a.atttypmod),
               CASE WHEN nulls_refused THEN fence_internal.equality_operator(a.atttypid) END
          INTO sql_type, equals
          FROM pg_attribute a WHERE a.attrelid = target AND a.attname = k AND a.attnum > 0 AND NOT a.attisdropped;
        IF sql_type IS NULL THEN
            RAISE EXCEPTION 'column "%" of % does not exist', k, table_name
                USING ERRCODE = '42703', HINT = 'The keys of changes and filter must be column names of the table, spelled exactly.';
        END IF;
        IF nulls_refused AND jsonb_typeof(v) = 'null' THEN
            PERFORM fence_internal.raise_invalid(format('%s value for column "%s" is null', argument, k),
                                        'Filter values are compared with =, which never matches NULL.');
        END IF;
        IF nulls_refused AND equals IS NULL THEN
            RAISE EXCEPTION 'filter column "%" has a type without an equality operator', k
                USING ERRCODE = '42883', HINT = 'Filter on columns whose type can be compared with =, such as the primary key.';
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;

-- The statement parts of a write: the SET list from changes ($1), the WHERE from filter ($2).
CREATE FUNCTION fence_internal.set_list(target oid, table_name text, changes jsonb) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT format('(%s) = (SELECT %s FROM pg_catalog.jsonb_to_record($1) AS c(%s))',
                  string_agg(format('%I', c.name), ', '), string_agg(format('c.%I', c.name), ', '),
                  string_agg(format('%I %s', c.name, c.sql_type), ', '))
      FROM fence_internal.object_columns(target, table_name, 'changes', changes, false) c
$$;

CREATE FUNCTION fence_internal.where_list(target oid, table_name text, filter jsonb) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT string_agg(format('t.%I %s (SELECT f.%I FROM pg_catalog.jsonb_to_record($2) AS f(%I %s))',
                             c.name, c.equals, c.name, c.name, c.sql_type), ' AND ')
      FROM fence_internal.object_columns(target, table_name, 'filter', filter, true) c
$$;

-- Runs a write's statement (every name in it qualified) under the caller's search_path `path`,
-- with $1 changes, $2 filter, $3 a bigint: the rows it writes, and a bigint[] the statement
-- returns as its one value (NULL when it returns none). search_path is the function's own again
-- when it returns (SET search_path: set_config's local change ends with the call).
CREATE FUNCTION fence_internal.run_as_caller(sql text, returns_answer boolean, path text, changes jsonb,
                                             filter jsonb, third bigint, OUT n bigint, OUT answer bigint[])
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_catalog.set_config('search_path', path, true);
    IF returns_answer THEN
        EXECUTE sql INTO answer USING changes, filter, third;
    ELSE
        EXECUTE sql USING changes, filter, third;
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
END
$$;

-- The column a write keeps a fence or version in: an integer column that changes must not set.
CREATE FUNCTION fence_internal.counter_column(target oid, table_name text, argument text, column_name text, changes jsonb)
RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    type oid;
BEGIN
    IF column_name IS NULL THEN PERFORM fence_internal.raise_null(argument); END IF;
    SELECT a.atttypid INTO type FROM pg_attribute a
     WHERE a.attrelid = target AND a.attname = column_name AND a.attnum > 0 AND NOT a.attisdropped;
    IF type IS NULL THEN
        RAISE EXCEPTION 'column "%" of % does not exist', column_name, table_name
            USING ERRCODE = '42703', HINT = 'The keys of changes and filter must be column names of the table, spelled exactly.';
    END IF;
    IF type NOT IN ('int2'::regtype, 'int4'::regtype, 'int8'::regtype) THEN
        RAISE EXCEPTION '% "%" of % is not an integer column', argument, column_name, table_name
            USING ERRCODE = '42804', HINT = 'Fences and versions are kept in an integer column (bigint is best).';
    END IF;
    IF changes ? column_name THEN
        PERFORM fence_internal.raise_invalid(format('changes must not set %s "%s"', argument, column_name),
                                    'pg_fence sets that column itself; leave it out of changes.');
    END IF;
    RETURN format('%I', column_name);
END
$$;

-- The UPDATE fenced_update makes once its guard passed, without the guard; as all the writes, it runs
-- under the caller's search_path (path), which the shells of schema fence pass.
CREATE FUNCTION fence_internal.update_matching(target oid, changes jsonb, filter jsonb, path text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    table_name text := fence_internal.target_table('fenced_update', target);
    set_sql text := fence_internal.set_list(target, table_name, changes);
    where_sql text := fence_internal.where_list(target, table_name, filter);
BEGIN
    RETURN (fence_internal.run_as_caller(format('UPDATE %s AS t SET %s WHERE %s', table_name, set_sql, where_sql),
                                         false, path, changes, filter, NULL)).n;
END
$$;

CREATE FUNCTION fence.update_matching(target oid, changes jsonb, filter jsonb) RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT fence_internal.update_matching(target, changes, filter, pg_catalog.current_setting('search_path')) $$;

CREATE FUNCTION fence_internal.fenced_update(key text, fence bigint, target oid, changes jsonb, filter jsonb,
                                             path text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    table_name text;
BEGIN
    PERFORM fence_internal.check_key(key);
    IF fence IS NULL THEN PERFORM fence_internal.raise_null('fence'); END IF;
    table_name := fence_internal.target_table('fenced_update', target);
    PERFORM fence_internal.set_list(target, table_name, changes);
    PERFORM fence_internal.where_list(target, table_name, filter);
    IF NOT fence_internal.fence_holds(key, fence) THEN
        PERFORM fence_internal.raise_stale_fence(key, fence);
    END IF;
    RETURN fence_internal.update_matching(target, changes, filter, path);
END
$$;

CREATE FUNCTION fence.fenced_update(key text, fence bigint, target regclass, changes jsonb, filter jsonb)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT fence_internal.fenced_update(key, fence, target, changes, filter, pg_catalog.current_setting('search_path')) $$;

-- fenced_write's last condition: may a row holding row_fence be written under fence? A refusal is
-- noted (setting fence.stale_row) for the fenced_write running it.
CREATE FUNCTION fence.fence_not_above(row_fence bigint, fence bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE COST 1000000 SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF fence IS NULL THEN PERFORM fence_internal.raise_null('fence'); END IF;
    IF row_fence > fence THEN
        PERFORM set_config('fence.stale_row', 'on', true);
        RETURN false;
    END IF;
    RETURN true;
END
$$;

CREATE FUNCTION fence_internal.raise_stale_write(target text, fence_column text, fence bigint, filter jsonb) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'fence % is stale for % in %', fence, filter, target
        USING ERRCODE = 'PF002',
              DETAIL = format('A row matching the filter already holds a higher %s.', fence_column),
              HINT = 'A writer with a newer fence got there first: stop, and do not retry with this fence.';
END
$$;

CREATE FUNCTION fence_internal.fenced_write(target oid, fence_column name, fence bigint, changes jsonb,
                                            filter jsonb, path text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    table_name text := fence_internal.target_table('fenced_write', target);
    set_sql text := fence_internal.set_list(target, table_name, changes);
    where_sql text := fence_internal.where_list(target, table_name, filter);
    col text := fence_internal.counter_column(target, table_name, 'fence_column', fence_column, changes);
    stale boolean;
    outer_flag text := current_setting('fence.stale_row', true);
    n bigint;
BEGIN
    IF fence IS NULL THEN PERFORM fence_internal.raise_null('fence'); END IF;
    stale := (fence_internal.run_as_caller(
        format('SELECT pg_catalog.array_agg(1) FROM (SELECT t.%s AS f FROM %s AS t WHERE %s FOR NO KEY UPDATE) t WHERE t.f OPERATOR(pg_catalog.>) $3',
               col, table_name, where_sql),
        true, path, changes, filter, fence)).answer IS NOT NULL;
    IF stale THEN
        PERFORM fence_internal.raise_stale_write(table_name, fence_column, fence, filter);
    END IF;
    PERFORM set_config('fence.stale_row', 'off', true);
    n := (fence_internal.run_as_caller(
        format('UPDATE %s AS t SET %s, %s = $3 WHERE %s AND fence.fence_not_above(t.%s, $3)',
               table_name, set_sql, col, where_sql, col),
        false, path, changes, filter, fence)).n;
    stale := current_setting('fence.stale_row', true) = 'on';
    PERFORM set_config('fence.stale_row', coalesce(outer_flag, 'off'), true);
    IF stale THEN
        PERFORM fence_internal.raise_stale_write(table_name, fence_column, fence, filter);
    END IF;
    RETURN n;
END
$$;

CREATE FUNCTION fence.fenced_write(target regclass, fence_column name, fence bigint, changes jsonb, filter jsonb)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT fence_internal.fenced_write(target, fence_column, fence, changes, filter, pg_catalog.current_setting('search_path')) $$;

-- The version check of versioned_update's UPDATE: the next version, or 40001.
CREATE FUNCTION fence.checked_version(target oid, row_version bigint, expected bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF expected IS NULL THEN PERFORM fence_internal.raise_null('expected'); END IF;
    IF row_version IS DISTINCT FROM expected THEN
        PERFORM fence_internal.raise_version_mismatch(coalesce((SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c
                                                         JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = target), '<NULL>'),
                                             expected, row_version);
    END IF;
    IF expected = 9223372036854775807 THEN
        RAISE EXCEPTION 'the row of % is at the highest version its column can hold', fence_internal.target_table('versioned_update', target)
            USING ERRCODE = '22003', HINT = 'Widen the version column to bigint, or start its versions again from 1.';
    END IF;
    RETURN expected + 1;
END
$$;

CREATE FUNCTION fence_internal.raise_version_mismatch(table_name text, expected bigint, actual bigint) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'version conflict on %: expected version %, the row has %', table_name, expected, coalesce(actual::text, 'NULL')
        USING ERRCODE = '40001', HINT = 'Another writer changed the row first: read it again and retry.';
END
$$;

-- The core of versioned_update (src/writes/occ.rs): lock the one matching row, compare, update.
CREATE FUNCTION fence_internal.update_versioned_row(target oid, version_column text, expected_version bigint,
                                                    changes jsonb, filter jsonb, path text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    table_name text := fence_internal.target_table('versioned_update', target);
    set_sql text := fence_internal.set_list(target, table_name, changes);
    where_sql text := fence_internal.where_list(target, table_name, filter);
    col text := fence_internal.counter_column(target, table_name, 'version_column', version_column, changes);
    found bigint[];
    written bigint[];
BEGIN
    IF expected_version IS NULL THEN PERFORM fence_internal.raise_null('expected_version'); END IF;
    found := (fence_internal.run_as_caller(
        format('SELECT pg_catalog.array_agg(v) FROM (SELECT t.%s::pg_catalog.int8 AS v FROM %s AS t WHERE %s LIMIT 2 FOR UPDATE) x',
               col, table_name, where_sql),
        true, path, changes, filter, NULL)).answer;
    IF found IS NULL THEN
        -- The row it waited for may have been deleted and inserted again meanwhile, which the lock
        -- does not follow: a look with a new snapshot (READ COMMITTED) finds it (src/writes/occ.rs).
        found := (fence_internal.run_as_caller(
            format('SELECT pg_catalog.array_agg(v) FROM (SELECT t.%s::pg_catalog.int8 AS v FROM %s AS t WHERE %s LIMIT 2 FOR UPDATE) x',
                   col, table_name, where_sql),
            true, path, changes, filter, NULL)).answer;
    END IF;
    IF cardinality(found) > 1 THEN
        RAISE EXCEPTION 'the filter matches more than one row of %; versioned_update changes exactly one', table_name
            USING ERRCODE = '21000', HINT = 'Filter on a unique key, such as the primary key.';
    END IF;
    IF found IS NULL THEN
        RAISE EXCEPTION 'no row of % matches the filter', table_name
            USING ERRCODE = 'P0002', HINT = 'Check the filter; versioned_update changes exactly one existing row.';
    END IF;
    IF found[1] IS DISTINCT FROM expected_version THEN
        PERFORM fence_internal.raise_version_mismatch(table_name, expected_version, found[1]);
    END IF;
    written := (fence_internal.run_as_caller(
        format('WITH w AS (UPDATE %s AS t SET %s, %s = fence.checked_version(%s::pg_catalog.oid, t.%s, $3) WHERE %s RETURNING t.%s::pg_catalog.int8 AS v) SELECT pg_catalog.array_agg(v) FROM w',
               table_name, set_sql, col, target::oid, col, where_sql, col),
        true, path, changes, filter, expected_version)).answer;
    IF written IS NULL THEN
        RAISE EXCEPTION 'no row of % matches the filter', table_name
            USING ERRCODE = 'P0002', HINT = 'Check the filter; versioned_update changes exactly one existing row.';
    END IF;
    RETURN written[1];
END
$$;

CREATE FUNCTION fence.update_versioned_row(target oid, version_column text, expected_version bigint,
                                           changes jsonb, filter jsonb)
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$
    SELECT fence_internal.update_versioned_row(target, version_column, expected_version, changes, filter,
                                               pg_catalog.current_setting('search_path'))
$$;
