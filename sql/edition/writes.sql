-- Writes a stale holder cannot make (src/writes/): the guard, fenced_update, fenced_write and the
-- core of versioned_update. None is SECURITY DEFINER but fence_holds, which reads the lease row:
-- the writes run with the caller's privileges, so table grants and row-level security apply.

-- The guard's core (src/writes/fencing.rs): true when `fence` is the fence of a live holder of the
-- key, as last committed; then the guard lock of that holder's slot is held, shared, until the
-- transaction ends (a grant replacing that holder takes it exclusively, so it waits for the writes).
-- A fence that does not hold is refused before any lock is taken. The lock is the subtransaction's
-- (PostgreSQL's pg_advisory_xact_lock_shared): a ROLLBACK TO SAVEPOINT gives it back
-- (docs/sql-edition.md).
CREATE FUNCTION fence.fence_holds(key text, fence bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER PARALLEL UNSAFE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    lock text;
BEGIN
    PERFORM fence.check_key(key);
    IF fence IS NULL THEN PERFORM fence.raise_null('fence'); END IF;
    IF pg_is_in_recovery() THEN
        PERFORM fence.require_writable('guard a write');
    END IF;
    SELECT fence.guard_lock_name(r.shared, r.slot) INTO lock
      FROM fence.key_rows(key, clock_timestamp()) r WHERE r.live AND r.fence = fence_holds.fence;
    IF lock IS NULL THEN
        PERFORM fence.require_latest(key, true);
        RETURN false;
    END IF;
    BEGIN
        PERFORM pg_advisory_xact_lock_shared(fence.lock_id(lock, key));
        PERFORM fence.require_latest(key, false);
        IF NOT EXISTS (SELECT FROM fence.key_rows(key, clock_timestamp()) r
                        WHERE r.live AND r.fence = fence_holds.fence AND fence.guard_lock_name(r.shared, r.slot) = lock) THEN
            RAISE SQLSTATE 'PFZ01';
        END IF;
    EXCEPTION WHEN SQLSTATE 'PFZ01' THEN
        RETURN false;
    END;
    RETURN true;
END
$$;

CREATE FUNCTION fence.raise_stale_fence(key text, fence bigint) RETURNS void
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
        PERFORM fence.raise_stale_fence(key, fence);
    END IF;
    RETURN true;
END
$$;

-- The target of a write: a table (42P01, 42809 otherwise), by its qualified name.
CREATE FUNCTION fence.target_table(function text, target oid) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    kind "char";
    name text;
BEGIN
    IF target IS NULL THEN PERFORM fence.raise_null('target'); END IF;
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

-- The columns an object names (changes or filter), checked: (name, type as SQL, equality operator).
CREATE FUNCTION fence.object_columns(target oid, table_name text, argument text, object jsonb, nulls_refused boolean)
RETURNS TABLE (name text, sql_type text, equals text)
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    k text;
    v jsonb;
BEGIN
    IF object IS NULL THEN PERFORM fence.raise_null(argument); END IF;
    IF jsonb_typeof(object) <> 'object' THEN
        PERFORM fence.raise_invalid(format('%s must be a JSON object of column names to values, not %s', argument, object),
                                    'For example ''{"status": "paid"}''.');
    END IF;
    IF object = '{}' THEN
        PERFORM fence.raise_invalid(format('%s must name at least one column', argument),
            'An empty filter would update every row of the table; name the row, e.g. ''{"id": 42}''.');
    END IF;
    FOR k, v IN SELECT * FROM jsonb_each(object) LOOP
        name := k;
        SELECT format_type(a.atttypid, a.atttypmod),
               (SELECT format('OPERATOR(%I.%s)', on_.nspname, o.oprname)
                  FROM pg_operator o JOIN pg_namespace on_ ON on_.oid = o.oprnamespace
                 WHERE o.oid = (SELECT CASE WHEN t.typtype = 'd' THEN (SELECT eq_opr FROM (SELECT o2.oid AS eq_opr FROM pg_operator o2
                                        WHERE o2.oprname = '=' AND o2.oprleft = t.typbasetype AND o2.oprright = t.typbasetype) x LIMIT 1)
                                     ELSE (SELECT o2.oid FROM pg_operator o2 WHERE o2.oprname = '=' AND o2.oprleft = a.atttypid
                                             AND o2.oprright = a.atttypid LIMIT 1) END
                                  FROM pg_type t WHERE t.oid = a.atttypid))
          INTO sql_type, equals
          FROM pg_attribute a WHERE a.attrelid = target AND a.attname = k AND a.attnum > 0 AND NOT a.attisdropped;
        IF sql_type IS NULL THEN
            RAISE EXCEPTION 'column "%" of % does not exist', k, table_name
                USING ERRCODE = '42703', HINT = 'The keys of changes and filter must be column names of the table, spelled exactly.';
        END IF;
        IF nulls_refused AND jsonb_typeof(v) = 'null' THEN
            PERFORM fence.raise_invalid(format('%s value for column "%s" is null', argument, k),
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
CREATE FUNCTION fence.set_list(target oid, table_name text, changes jsonb) RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT format('(%s) = (SELECT %s FROM pg_catalog.jsonb_to_record($1) AS c(%s))',
                  string_agg(format('%I', c.name), ', '), string_agg(format('c.%I', c.name), ', '),
                  string_agg(format('%I %s', c.name, c.sql_type), ', '))
      FROM fence.object_columns(target, table_name, 'changes', changes, false) c
$$;

CREATE FUNCTION fence.where_list(target oid, table_name text, filter jsonb) RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT string_agg(format('t.%I %s (SELECT f.%I FROM pg_catalog.jsonb_to_record($2) AS f(%I %s))',
                             c.name, c.equals, c.name, c.name, c.sql_type), ' AND ')
      FROM fence.object_columns(target, table_name, 'filter', filter, true) c
$$;

-- The column a write keeps a fence or version in: an integer column that changes must not set.
CREATE FUNCTION fence.counter_column(target oid, table_name text, argument text, column_name text, changes jsonb)
RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    type oid;
BEGIN
    IF column_name IS NULL THEN PERFORM fence.raise_null(argument); END IF;
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
        PERFORM fence.raise_invalid(format('changes must not set %s "%s"', argument, column_name),
                                    'pg_fence sets that column itself; leave it out of changes.');
    END IF;
    RETURN format('%I', column_name);
END
$$;

-- The UPDATE fenced_update makes once its guard passed, without the guard. The three functions that
-- run the caller's UPDATE keep the caller's search_path (every name in their statements is
-- qualified), so that a domain's errors name it as the caller's own UPDATE would.
CREATE FUNCTION fence.update_matching(target oid, changes jsonb, filter jsonb) RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    table_name text := fence.target_table('fenced_update', target);
    set_sql text := fence.set_list(target, table_name, changes);
    where_sql text := fence.where_list(target, table_name, filter);
    n bigint;
BEGIN
    EXECUTE format('UPDATE %s AS t SET %s WHERE %s', table_name, set_sql, where_sql) USING changes, filter;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

CREATE FUNCTION fence.fenced_update(key text, fence bigint, target regclass, changes jsonb, filter jsonb)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    table_name text;
BEGIN
    PERFORM fence.check_key(key);
    IF fence IS NULL THEN PERFORM fence.raise_null('fence'); END IF;
    table_name := fence.target_table('fenced_update', target);
    PERFORM fence.set_list(target, table_name, changes);
    PERFORM fence.where_list(target, table_name, filter);
    IF NOT fence.fence_holds(key, fence) THEN
        PERFORM fence.raise_stale_fence(key, fence);
    END IF;
    RETURN fence.update_matching(target, changes, filter);
END
$$;

-- fenced_write's last condition: may a row holding row_fence be written under fence? A refusal is
-- noted (setting fence.stale_row) for the fenced_write running it.
CREATE FUNCTION fence.fence_not_above(row_fence bigint, fence bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE COST 1000000 SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF fence IS NULL THEN PERFORM fence.raise_null('fence'); END IF;
    IF row_fence > fence THEN
        PERFORM set_config('fence.stale_row', 'on', true);
        RETURN false;
    END IF;
    RETURN true;
END
$$;

CREATE FUNCTION fence.raise_stale_write(target text, fence_column text, fence bigint, filter jsonb) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'fence % is stale for % in %', fence, filter, target
        USING ERRCODE = 'PF002',
              DETAIL = format('A row matching the filter already holds a higher %s.', fence_column),
              HINT = 'A writer with a newer fence got there first: stop, and do not retry with this fence.';
END
$$;

CREATE FUNCTION fence.fenced_write(target regclass, fence_column name, fence bigint, changes jsonb, filter jsonb)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    table_name text := fence.target_table('fenced_write', target);
    set_sql text := fence.set_list(target, table_name, changes);
    where_sql text := fence.where_list(target, table_name, filter);
    col text := fence.counter_column(target, table_name, 'fence_column', fence_column, changes);
    stale boolean;
    outer_flag text := current_setting('fence.stale_row', true);
    n bigint;
BEGIN
    IF fence IS NULL THEN PERFORM fence.raise_null('fence'); END IF;
    EXECUTE format('SELECT coalesce(bool_or(t.%s > $3), false) FROM (SELECT t.%s FROM %s AS t WHERE %s FOR NO KEY UPDATE) t',
                   col, col, table_name, where_sql) INTO stale USING changes, filter, fence;
    IF stale THEN
        PERFORM fence.raise_stale_write(table_name, fence_column, fence, filter);
    END IF;
    PERFORM set_config('fence.stale_row', 'off', true);
    EXECUTE format('UPDATE %s AS t SET %s, %s = $3 WHERE %s AND fence.fence_not_above(t.%s, $3)',
                   table_name, set_sql, col, where_sql, col) USING changes, filter, fence;
    GET DIAGNOSTICS n = ROW_COUNT;
    stale := current_setting('fence.stale_row', true) = 'on';
    PERFORM set_config('fence.stale_row', coalesce(outer_flag, 'off'), true);
    IF stale THEN
        PERFORM fence.raise_stale_write(table_name, fence_column, fence, filter);
    END IF;
    RETURN n;
END
$$;

-- The version check of versioned_update's UPDATE: the next version, or 40001.
CREATE FUNCTION fence.checked_version(target oid, row_version bigint, expected bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF expected IS NULL THEN PERFORM fence.raise_null('expected'); END IF;
    IF row_version IS DISTINCT FROM expected THEN
        PERFORM fence.raise_version_mismatch(coalesce((SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c
                                                         JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = target), '<NULL>'),
                                             expected, row_version);
    END IF;
    IF expected = 9223372036854775807 THEN
        RAISE EXCEPTION 'the row of % is at the highest version its column can hold', fence.target_table('versioned_update', target)
            USING ERRCODE = '22003', HINT = 'Widen the version column to bigint, or start its versions again from 1.';
    END IF;
    RETURN expected + 1;
END
$$;

CREATE FUNCTION fence.raise_version_mismatch(table_name text, expected bigint, actual bigint) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'version conflict on %: expected version %, the row has %', table_name, expected, coalesce(actual::text, 'NULL')
        USING ERRCODE = '40001', HINT = 'Another writer changed the row first: read it again and retry.';
END
$$;

-- The core of versioned_update (src/writes/occ.rs): lock the one matching row, compare, update.
CREATE FUNCTION fence.update_versioned_row(target oid, version_column text, expected_version bigint,
                                           changes jsonb, filter jsonb)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    table_name text := fence.target_table('versioned_update', target);
    set_sql text := fence.set_list(target, table_name, changes);
    where_sql text := fence.where_list(target, table_name, filter);
    col text := fence.counter_column(target, table_name, 'version_column', version_column, changes);
    found bigint[];
    written bigint[];
BEGIN
    IF expected_version IS NULL THEN PERFORM fence.raise_null('expected_version'); END IF;
    EXECUTE format('SELECT array_agg(v) FROM (SELECT t.%s::pg_catalog.int8 AS v FROM %s AS t WHERE %s LIMIT 2 FOR UPDATE) x',
                   col, table_name, where_sql) INTO found USING changes, filter;
    IF found IS NULL THEN
        -- The row it waited for may have been deleted and inserted again meanwhile, which the lock
        -- does not follow: a look with a new snapshot (READ COMMITTED) finds it (src/writes/occ.rs).
        EXECUTE format('SELECT array_agg(v) FROM (SELECT t.%s::pg_catalog.int8 AS v FROM %s AS t WHERE %s LIMIT 2 FOR UPDATE) x',
                       col, table_name, where_sql) INTO found USING changes, filter;
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
        PERFORM fence.raise_version_mismatch(table_name, expected_version, found[1]);
    END IF;
    EXECUTE format('WITH w AS (UPDATE %s AS t SET %s, %s = fence.checked_version(%s::pg_catalog.oid, t.%s, $3) WHERE %s RETURNING t.%s::pg_catalog.int8 AS v) SELECT array_agg(v) FROM w',
                   table_name, set_sql, col, target::oid, col, where_sql, col) INTO written USING changes, filter, expected_version;
    IF written IS NULL THEN
        RAISE EXCEPTION 'no row of % matches the filter', table_name
            USING ERRCODE = 'P0002', HINT = 'Check the filter; versioned_update changes exactly one existing row.';
    END IF;
    RETURN written[1];
END
$$;
