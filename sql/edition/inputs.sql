-- The argument checks of src/pg/input.rs and src/pg/errors.rs, with their SQLSTATEs, messages and
-- HINTs: nothing is touched when an argument is bad.
CREATE FUNCTION fence_internal.raise_null(argument text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION '% must not be NULL', argument
        USING ERRCODE = '22004', HINT = 'Pass a value for every required argument of pg_fence''s functions.';
END
$$;

CREATE FUNCTION fence_internal.raise_invalid(message text, hint text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION '%', message USING ERRCODE = '22023', HINT = hint;
END
$$;

CREATE FUNCTION fence_internal.check_key(key text) RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF key IS NULL THEN
        PERFORM fence_internal.raise_null('key');
    ELSIF key = '' THEN
        PERFORM fence_internal.raise_invalid('key must not be empty', 'Name the resource the lease protects, for example ''invoice:42''.');
    ELSIF octet_length(key) > 512 THEN
        PERFORM fence_internal.raise_invalid(format('key is %s bytes long, more than the limit of 512', octet_length(key)),
                                    'Use a shorter key, for example a hash of the long name.');
    END IF;
    RETURN key;
END
$$;

-- An interval in microseconds, as the extension counts it (a month is 30 days).
CREATE FUNCTION fence_internal.micros(value interval) RETURNS numeric
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp
AS $$
    -- An infinite interval (PostgreSQL 17 and later) has no hours, minutes or seconds to extract.
    SELECT CASE WHEN isfinite(value) THEN
               ((extract(year FROM value) * 12 + extract(month FROM value)) * 30 + extract(day FROM value)) * 86400000000
               + (extract(hour FROM value) * 3600 + extract(minute FROM value) * 60 + extract(second FROM value)) * 1000000
           WHEN value > interval '0' THEN 'Infinity'::numeric
           ELSE '-Infinity'::numeric END
$$;

CREATE FUNCTION fence_internal.is_infinite(value interval) RETURNS boolean
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp
AS $$
    -- PostgreSQL 17 and later have infinite intervals (isfinite says so; -infinity is caught as not
    -- positive, as the extension does); before, the extreme months and days stand for them.
    SELECT (NOT isfinite(value) AND value > interval '0')
           OR (abs(extract(year FROM value) * 12 + extract(month FROM value)) = 2147483647
               AND abs(extract(day FROM value)) = 2147483647)
$$;

CREATE FUNCTION fence_internal.check_ttl(ttl interval) RETURNS bigint
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    hint text := 'Pass a positive, finite interval no longer than pg_fence.max_ttl, such as ''30 seconds''.';
    us numeric;
    max_us numeric := fence_internal.micros(fence_internal.setting('max_ttl')::interval);
BEGIN
    IF ttl IS NULL THEN
        PERFORM fence_internal.raise_null('ttl');
    END IF;
    IF fence_internal.is_infinite(ttl) THEN
        PERFORM fence_internal.raise_invalid('ttl must be finite', hint);
    END IF;
    us := fence_internal.micros(ttl);
    IF us <= 0 THEN
        PERFORM fence_internal.raise_invalid(format('ttl must be positive, got %s', ttl), hint);
    END IF;
    IF us > max_us THEN
        PERFORM fence_internal.raise_invalid(format('ttl %s exceeds pg_fence.max_ttl (%s s)', ttl, trunc(max_us / 1000000)),
                                    'Renew the lease periodically instead, or ask a superuser to raise pg_fence.max_ttl.');
    END IF;
    RETURN us::bigint;
END
$$;

CREATE FUNCTION fence_internal.check_duration(value interval, argument text, hint text) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    us numeric;
BEGIN
    IF value IS NULL THEN
        PERFORM fence_internal.raise_null(argument);
    END IF;
    us := fence_internal.micros(value);
    IF fence_internal.is_infinite(value) THEN
        PERFORM fence_internal.raise_invalid(format('%s must be finite', argument), hint);
    END IF;
    IF us > 3110400000000000 THEN  -- 100 years of 12 months of 30 days
        PERFORM fence_internal.raise_invalid(format('%s %s is longer than the limit of 100 years', argument, value), hint);
    END IF;
    IF us < 0 THEN
        PERFORM fence_internal.raise_invalid(format('%s must not be negative, got %s', argument, value), hint);
    END IF;
    RETURN us::bigint;
END
$$;

CREATE FUNCTION fence_internal.check_wait(wait interval) RETURNS bigint
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp
AS $$ SELECT fence_internal.check_duration(wait, 'wait', 'Pass how long to wait for the key, such as ''5 seconds'', or ''0'' not to wait.') $$;

CREATE FUNCTION fence_internal.check_lock_delay(lock_delay interval) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    hint text := 'Pass how long nobody may be granted the key after this lease ends other than by a release, '
                 'such as ''15 seconds'', at most ''1 hour''; ''0'' for no delay.';
    us bigint := fence_internal.check_duration(lock_delay, 'lock_delay', hint);
BEGIN
    IF us > 3600000000 THEN
        PERFORM fence_internal.raise_invalid('lock_delay must be at most 1 hour', hint);
    END IF;
    RETURN us;
END
$$;

-- The owner label: NULL or empty means application_name, or pid:<backend pid>.
CREATE FUNCTION fence_internal.check_owner(owner text) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF octet_length(owner) > 256 THEN
        PERFORM fence_internal.raise_invalid(format('owner is %s bytes long, more than the limit of 256', octet_length(owner)),
                                    'Use a short label such as a host name and process id.');
    END IF;
    RETURN coalesce(nullif(owner, ''), nullif(current_setting('application_name'), ''), 'pid:' || pg_backend_pid());
END
$$;

CREATE FUNCTION fence_internal.check_token(token uuid) RETURNS uuid
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF token = '00000000-0000-0000-0000-000000000000' THEN
        PERFORM fence_internal.raise_invalid('token must not be the nil uuid',
                                    'Pass a random uuid, such as gen_random_uuid() or uuid.uuid4(), and the same one when you retry.');
    END IF;
    RETURN token;
END
$$;

-- A key set (lease_acquire_all, lease_release_all, lease_renew_all): sorted, checked.
CREATE FUNCTION fence_internal.check_keys(keys text[], most integer, hint text, sorted boolean) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    flat text[];
    twice text;
BEGIN
    IF keys IS NULL THEN
        PERFORM fence_internal.raise_null('keys');
    END IF;
    flat := ARRAY(SELECT k FROM unnest(keys) k);
    IF cardinality(flat) = 0 THEN
        PERFORM fence_internal.raise_invalid('keys must not be empty', hint);
    END IF;
    IF cardinality(flat) > most THEN
        PERFORM fence_internal.raise_invalid(format('keys has %s elements, more than the limit of %s', cardinality(flat), most), hint);
    END IF;
    IF array_position(flat, NULL) IS NOT NULL THEN
        PERFORM fence_internal.raise_null('an element of keys');
    END IF;
    PERFORM fence_internal.check_key(k) FROM unnest(flat) k;
    SELECT k INTO twice FROM unnest(flat) k GROUP BY k HAVING count(*) > 1 ORDER BY k COLLATE "C" LIMIT 1;
    IF twice IS NOT NULL THEN
        PERFORM fence_internal.raise_invalid(format('key "%s" appears more than once in keys', twice), hint);
    END IF;
    IF sorted THEN
        RETURN ARRAY(SELECT k FROM unnest(flat) k ORDER BY k COLLATE "C");
    END IF;
    RETURN flat;
END
$$;

CREATE FUNCTION fence_internal.require_writable(what text) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_is_in_recovery() THEN
        RAISE EXCEPTION 'cannot % on a standby server', what USING ERRCODE = '25006',
            HINT = 'Leases live on the primary: connect to it (for example with target_session_attrs=read-write).';
    END IF;
    IF current_setting('transaction_read_only')::boolean THEN
        RAISE EXCEPTION 'cannot % in a read-only transaction', what USING ERRCODE = '25006',
            HINT = 'Run the call in a read-write transaction.';
    END IF;
END
$$;

-- A grant or renewal that a client has seen must survive a crash: its commit flushes
-- (src/leases/state/durability.rs). Raised with SET LOCAL at the call, not at commit: a later
-- SET LOCAL synchronous_commit in the same transaction can still lower it (docs/sql-edition.md).
CREATE FUNCTION fence_internal.require_durable_commit() RETURNS void
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT set_config('synchronous_commit', 'on', true)
     WHERE current_setting('synchronous_commit') IN ('off', 'local')
$$;
