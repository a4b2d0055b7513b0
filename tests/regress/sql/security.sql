-- What an ordinary role can and cannot do.
CREATE EXTENSION pg_fence;
-- Nothing in schema fence is for PUBLIC but the sweeper's figures: leases, fencing and the view
-- fence.leases are for fence_user; lease_revoke and sweep for fence_admin, who is a fence_user too.
CREATE ROLE fence_nobody LOGIN;
SET ROLE fence_nobody;
SELECT try($$SELECT fence.lease_acquire('k', '1 minute')$$) AS acquire;
SELECT try($$SELECT fence.fence_guard('k', 1)$$) AS guard;
SELECT try($$SELECT fence.fence_holds('k', 1)$$) AS guard_core;
SELECT try($$SELECT fence.current_fence('k')$$) AS current_fence;
SELECT try($$SELECT count(*) FROM fence.leases$$) AS leases_view;
SELECT try($$SELECT fence.sweep()$$) AS sweep;
SELECT count(*) AS sweeper_view FROM fence.sweeper;
RESET ROLE;
SELECT fence.current_fence('k') IS NULL AS nothing_was_granted;
SELECT r.rolname, m.rolname AS member_of
  FROM pg_auth_members a JOIN pg_roles r ON r.oid = a.member JOIN pg_roles m ON m.oid = a.roleid
 WHERE m.rolname IN ('fence_user', 'fence_admin') AND r.rolname LIKE 'fence\_%' ORDER BY 1, 2;
SELECT p.proname,
       has_function_privilege('public', p.oid, 'EXECUTE') AS public,
       has_function_privilege('fence_user', p.oid, 'EXECUTE') AS fence_user,
       has_function_privilege('fence_admin', p.oid, 'EXECUTE') AS fence_admin
  FROM pg_proc p WHERE p.pronamespace = 'fence'::regnamespace ORDER BY 1;
GRANT fence_user TO fence_nobody;
SET ROLE fence_nobody;
SELECT (fence.lease_acquire('k', '1 minute')).fence AS k_fence \gset
SELECT :k_fence IS NOT NULL AS now_granted;
SELECT try($$SELECT fence.sweep()$$) AS sweep_still_refused;
SELECT try($$SELECT fence.lease_revoke('k')$$) AS revoke_still_refused;
RESET ROLE;
DROP ROLE fence_nobody;

CREATE ROLE fence_app LOGIN IN ROLE fence_user;
CREATE ROLE fence_other LOGIN IN ROLE fence_user;
SELECT fence.lease_acquire('shared', '1 hour', 'superuser-holder') AS l \gset

SET ROLE fence_app;
-- The functions and the view work for everyone... (The fences, which differ from run to run, are
-- shown by name: named() of _setup.sql.)
SELECT (fence.lease_acquire('app-key', '1 minute', 'app')).fence AS app_fence \gset
SELECT jsonb_build_object('k_fence', :k_fence, 'app_fence', :app_fence,
                          'shared_fence', (:'l'::fence.lease).fence) AS fences \gset
SELECT key, owner, named(fence::text, :'fences') AS fence, live FROM fence.leases ORDER BY key;
SELECT named(fence.current_fence('shared')::text, :'fences') AS current_fence;
-- ...but the table behind them does not, and no token is visible anywhere.
SELECT * FROM fence.lease_state;
UPDATE fence.lease_state SET expires_at = now();
DELETE FROM fence.lease_state;
INSERT INTO fence.lease_state VALUES ('x', 1, 'me', NULL, now(), now());
TRUNCATE fence.lease_state;
SELECT * FROM fence.leases WHERE false;
-- The Rust core behind lease_renew answers NULL to a wrong token, and changes nothing.
SELECT fence.renew_if_held('shared', gen_random_uuid(), '1 hour');
-- Without the token, another holder's lease cannot be released or renewed...
SELECT fence.lease_release('shared', gen_random_uuid());
SELECT fence.lease_renew('shared', gen_random_uuid(), '1 hour');
-- (That such calls never hold up the holder is tested with two sessions in tests/tests/leases.rs.)
RESET ROLE;
SELECT owner, live FROM fence.leases WHERE key = 'shared';

-- Revoking another holder's lease takes role fence_admin (or a superuser).
SET ROLE fence_app;
SELECT fence.lease_revoke('shared');
RESET ROLE;
GRANT fence_admin TO fence_app;
SET ROLE fence_app;
SELECT fence.lease_revoke('shared') AS revoked;
SELECT fence.lease_revoke('shared') AS revoked_again;
SELECT try_in_full(format('SELECT fence.fence_guard(%L, %s)', 'shared', (:'l'::fence.lease).fence), :'fences')
    AS revoked_fence;
SELECT (fence.lease_acquire('shared', '1 minute', 'next-holder')).fence > (:'l'::fence.lease).fence AS next_fence_is_higher;
RESET ROLE;
REVOKE fence_admin FROM fence_app;

-- Every SECURITY DEFINER function pins search_path.
SELECT p.proname, p.proconfig
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = 'fence' AND p.prosecdef
 ORDER BY 1;

-- fence.sweeper_stats is as closed as fence.lease_state; its view fence.sweeper is open.
SET ROLE fence_other;
SELECT * FROM fence.sweeper_stats;
UPDATE fence.sweeper_stats SET total_swept = 0;
DELETE FROM fence.sweeper_stats;
INSERT INTO fence.sweeper_stats DEFAULT VALUES;
TRUNCATE fence.sweeper_stats;
SELECT last_swept FROM fence.sweeper;
-- The token hashes do not leak through the planner's statistics either: pg_stats shows only the
-- columns a role may read.
RESET ROLE;
ANALYZE fence.lease_state;
SELECT count(*) > 0 AS superuser_sees_statistics FROM pg_stats WHERE schemaname = 'fence';
SET ROLE fence_other;
SELECT count(*) AS statistics_visible FROM pg_stats WHERE schemaname = 'fence';
-- Nobody but the extension's owner can put objects into schema fence, or change the ones there:
-- the SQL shells find pg_fence's functions by their names in it.
CREATE FUNCTION fence.fence_holds(key text, fence bigint, spare int) RETURNS boolean
    LANGUAGE sql AS 'SELECT true';
CREATE OR REPLACE FUNCTION fence.fence_holds(key text, fence bigint) RETURNS boolean
    LANGUAGE sql AS 'SELECT true';
ALTER FUNCTION fence.fence_guard(text, bigint) SET search_path = public;
CREATE TABLE fence.lease_state_copy ();
RESET ROLE;

-- Fenced and versioned writes run as the caller: column privileges and row-level security, USING
-- and WITH CHECK, apply to all three. (fencing.sql and occ.sql show table privileges, and a policy
-- hiding a row from fenced_update and versioned_update.)
CREATE TABLE ledger (id int PRIMARY KEY, owner_name text, note text, amount int, fence bigint,
                     version bigint NOT NULL DEFAULT 1);
INSERT INTO ledger VALUES (1, 'fence_other', 'n1', 10, NULL, 1), (2, 'someone-else', 'n2', 20, NULL, 1);
GRANT SELECT (id, owner_name, note, fence, version), UPDATE (note, fence, version) ON ledger TO fence_other;
ALTER TABLE ledger ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_rows ON ledger TO fence_other
    USING (owner_name = current_user) WITH CHECK (note <> 'forbidden');
SET ROLE fence_other;
SELECT fence AS ledger_fence FROM fence.lease_acquire('ledger', '1 hour', 'other') \gset
SELECT fence.fenced_update('ledger', :ledger_fence, 'ledger', '{"note": "by fenced_update"}', '{"id": 1}') AS own_row;
SELECT fence.fenced_update('ledger', :ledger_fence, 'ledger', '{"note": "x"}', '{"id": 2}') AS hidden_row;
SELECT fence.fenced_write('ledger', 'fence', 7, '{"note": "by fenced_write"}', '{"id": 1}') AS own_row;
SELECT fence.fenced_write('ledger', 'fence', 7, '{"note": "x"}', '{"id": 2}') AS hidden_row;
SELECT fence.versioned_update('ledger', 'version', 1, '{"note": "by versioned_update"}', '{"id": 1}') AS new_version;
SELECT call, try(replace(call, '@fence@', :'ledger_fence')) AS outcome FROM (VALUES
    ($$SELECT fence.fenced_update('ledger', @fence@, 'ledger', '{"amount": 0}', '{"id": 1}')$$),
    ($$SELECT fence.fenced_update('ledger', @fence@, 'ledger', '{"note": "x"}', '{"amount": 10}')$$),
    ($$SELECT fence.fenced_update('ledger', @fence@, 'ledger', '{"note": "forbidden"}', '{"id": 1}')$$),
    ($$SELECT fence.fenced_write('ledger', 'fence', 8, '{"amount": 0}', '{"id": 1}')$$),
    ($$SELECT fence.fenced_write('ledger', 'fence', 8, '{"note": "forbidden"}', '{"id": 1}')$$),
    ($$SELECT fence.versioned_update('ledger', 'version', 2, '{"amount": 0}', '{"id": 1}')$$),
    ($$SELECT fence.versioned_update('ledger', 'version', 2, '{"note": "forbidden"}', '{"id": 1}')$$),
    ($$SELECT fence.versioned_update('ledger', 'version', 1, '{"note": "x"}', '{"id": 2}')$$)
) AS cases(call);
RESET ROLE;
SELECT * FROM ledger ORDER BY id;

-- search_path attacks. The SQL shells (lease_renew, versioned_update) are LANGUAGE sql without SET
-- search_path, so that PostgreSQL inlines them; they are parsed with the caller's search_path, and
-- only their schema-qualified names keep them on pg_fence's objects. (fence_guard, fenced_update and
-- fenced_write are C entry points, not shells; look-alikes of the names such shells would call are
-- planted too, and must change nothing either.) Role fence_mallory plants look-alikes of the names that the shells and
-- pg_fence's statements use, puts them on its search_path in three ways, and runs the same calls as
-- with the default search_path: each call's outcome, and what it leaves behind, must be the same.
CREATE ROLE fence_mallory LOGIN IN ROLE fence_user;
CREATE SCHEMA mallory AUTHORIZATION fence_mallory;
CREATE TABLE accounts (id int PRIMARY KEY, name varchar(20), balance int, fence bigint,
                       version bigint NOT NULL DEFAULT 1);
INSERT INTO accounts VALUES (1, 'alice', 100, 5, 1), (2, 'bob', 200, 5, 1);
GRANT SELECT, UPDATE ON accounts TO fence_mallory;
SELECT (fence.lease_acquire('other-key', '1 hour', 'someone-else')).fence AS other_fence \gset
SELECT :other_fence IS NOT NULL AS other_key_held;

SET ROLE fence_mallory;
SELECT fence AS m_fence, token AS m_token FROM fence.lease_acquire('mallory-key', '1 hour', 'mallory') \gset
CREATE TABLE mallory.docs (id int PRIMARY KEY, body text, version bigint NOT NULL DEFAULT 1);
-- Functions named as the ones pg_fence calls, with their argument types, answering what would let
-- a stale or tokenless caller through...
CREATE FUNCTION mallory.sha256(bytea) RETURNS bytea LANGUAGE sql AS $$ SELECT '\x00'::bytea $$;
CREATE FUNCTION mallory.uuid_send(uuid) RETURNS bytea LANGUAGE sql AS $$ SELECT '\x00'::bytea $$;
CREATE FUNCTION mallory.clock_timestamp() RETURNS timestamptz LANGUAGE sql AS $$ SELECT '-infinity'::timestamptz $$;
CREATE FUNCTION mallory.now() RETURNS timestamptz LANGUAGE sql AS $$ SELECT '-infinity'::timestamptz $$;
CREATE FUNCTION mallory.pg_notify(text, text) RETURNS void LANGUAGE sql AS $$ SELECT $$;
CREATE FUNCTION mallory.jsonb_to_record(jsonb) RETURNS record LANGUAGE sql AS $$ SELECT ROW(1) $$;
CREATE FUNCTION mallory."coalesce"(timestamptz, timestamptz) RETURNS timestamptz
    LANGUAGE sql AS $$ SELECT 'infinity'::timestamptz $$;
CREATE FUNCTION mallory.fence_holds(text, bigint) RETURNS boolean LANGUAGE sql AS $$ SELECT true $$;
CREATE FUNCTION mallory.renew_if_held(text, uuid, interval) RETURNS timestamptz
    LANGUAGE sql AS $$ SELECT 'infinity'::timestamptz $$;
CREATE FUNCTION mallory.raise_lease_lost(text) RETURNS timestamptz
    LANGUAGE sql AS $$ SELECT 'infinity'::timestamptz $$;
CREATE FUNCTION mallory.raise_stale_fence(text, bigint, anyelement) RETURNS anyelement
    LANGUAGE sql AS $$ SELECT $3 $$;
CREATE FUNCTION mallory.raise_stale_write(regclass, name, bigint, jsonb) RETURNS bigint
    LANGUAGE sql AS $$ SELECT 0::bigint $$;
CREATE FUNCTION mallory.holder_alive(integer, bigint) RETURNS boolean LANGUAGE sql AS $$ SELECT true $$;
CREATE FUNCTION mallory.update_matching(oid, jsonb, jsonb) RETURNS bigint LANGUAGE sql AS $$ SELECT 0::bigint $$;
-- (enable_versioning builds its CREATE TRIGGER statements with format())
CREATE FUNCTION mallory.format(text, name, regclass, name) RETURNS text
    LANGUAGE sql AS $$ SELECT 'GRANT fence_admin TO fence_mallory' $$;
CREATE FUNCTION mallory.format(text, regclass, name) RETURNS text LANGUAGE sql AS $$ SELECT 'SELECT' $$;
CREATE FUNCTION mallory.format(text, regclass) RETURNS text LANGUAGE sql AS $$ SELECT 'SELECT' $$;
-- ...and operators: an = that always holds, a > that never does, and a + that adds a thousand.
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['text', 'varchar', 'integer', 'bigint', 'bytea', 'uuid', 'oid', 'timestamptz'] LOOP
        EXECUTE format('CREATE FUNCTION mallory.always(%s, %s) RETURNS boolean LANGUAGE sql AS ''SELECT true''', t, t);
        EXECUTE format('CREATE FUNCTION mallory.never(%s, %s) RETURNS boolean LANGUAGE sql AS ''SELECT false''', t, t);
        EXECUTE format('CREATE OPERATOR mallory.= (FUNCTION = mallory.always, LEFTARG = %s, RIGHTARG = %s)', t, t);
        EXECUTE format('CREATE OPERATOR mallory.> (FUNCTION = mallory.never, LEFTARG = %s, RIGHTARG = %s)', t, t);
    END LOOP;
END
$$;
CREATE FUNCTION mallory.plus(bigint, integer) RETURNS bigint LANGUAGE sql AS $$ SELECT $1 - -1000 $$;
CREATE OPERATOR mallory.+ (FUNCTION = mallory.plus, LEFTARG = bigint, RIGHTARG = integer);
-- Temporary look-alikes: relations in pg_temp are found first when it is listed first (functions
-- and operators there never are, but they are planted anyway).
CREATE TEMP TABLE lease_state (key text, fence bigint, token_hash bytea, expires_at timestamptz);
CREATE TEMP VIEW leases AS SELECT 'other-key'::text AS key, true AS live;
CREATE FUNCTION pg_temp.fence_holds(text, bigint) RETURNS boolean LANGUAGE sql AS $$ SELECT true $$;
CREATE FUNCTION pg_temp.sha256(bytea) RETURNS bytea LANGUAGE sql AS $$ SELECT '\x00'::bytea $$;
CREATE FUNCTION pg_temp.always(integer, integer) RETURNS boolean LANGUAGE sql AS $$ SELECT true $$;
CREATE OPERATOR pg_temp.= (FUNCTION = pg_temp.always, LEFTARG = integer, RIGHTARG = integer);
RESET ROLE;

-- Each call runs in a subtransaction that is rolled back once its outcome (by try()), its value and
-- a digest of what it left behind are taken, so that every search_path starts from the same state.
-- Nothing is compared while the attack is on: the comparisons come after RESET search_path. A
-- fence granted by the call is the clock at its grant, other under each search_path: in the value
-- and the digest it is shown as <issued> when it lies between the clock before and after the call,
-- where a first grant's fence must be.
CREATE TEMP TABLE attack_value (value text);
CREATE TEMP TABLE attack_cases (n serial, template text, call text);
CREATE TEMP TABLE attack_results (path text, n int, outcome text, value text, state text);
GRANT SELECT, INSERT, DELETE ON attack_value, attack_cases, attack_results TO fence_mallory;
CREATE FUNCTION issued(shown text, issued_from bigint, issued_to bigint) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN shown ~ '^[0-9]{1,18}$' AND shown::bigint BETWEEN issued_from AND issued_to
                THEN '<issued>' ELSE shown END
$$;
CREATE FUNCTION attack_state(issued_from bigint, issued_to bigint) RETURNS text
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT md5(concat_ws(' | ',
        (SELECT string_agg(concat_ws(',', key, public.issued(fence::text, issued_from, issued_to), owner,
                                     token_hash IS NULL, session_pid IS NULL),
                           ';' ORDER BY key)
           FROM fence.lease_state),
        (SELECT string_agg(a::text, ';' ORDER BY id) FROM public.accounts a),
        (SELECT coalesce(string_agg(tgname, ',' ORDER BY tgname), '-')
           FROM pg_trigger WHERE tgrelid = 'mallory.docs'::regclass),
        pg_has_role('fence_mallory', 'fence_admin', 'MEMBER')::text))
$$;
CREATE FUNCTION attack_case(call text, OUT outcome text, OUT value text, OUT state text)
LANGUAGE plpgsql AS $$
DECLARE
    issued_from bigint;
    issued_to bigint;
BEGIN
    BEGIN
        DELETE FROM attack_value;
        issued_from := public.clock_us();
        outcome := try('INSERT INTO attack_value SELECT (' || call || ')::text');
        issued_to := public.clock_us();
        SELECT public.issued(v.value, issued_from, issued_to) INTO value FROM attack_value v;
        state := attack_state(issued_from, issued_to);
        RAISE EXCEPTION 'undo';
    EXCEPTION WHEN raise_exception THEN
        NULL;
    END;
END $$;

INSERT INTO attack_cases (template) VALUES
    ($$(fence.lease_acquire('other-key', '1 hour', 'mallory')).fence$$),
    ($$(fence.lease_acquire('new-key', '1 hour', 'mallory')).fence$$),
    ($$fence.lease_renew('other-key', gen_random_uuid(), '1 hour') IS NOT NULL$$),
    ($$fence.lease_renew('mallory-key', @token@, '1 hour') IS NOT NULL$$),
    ($$fence.renew_if_held('other-key', gen_random_uuid(), '1 hour')$$),
    ($$fence.lease_release('other-key', gen_random_uuid())$$),
    ($$fence.lease_release('mallory-key', @token@)$$),
    ($$fence.lease_revoke('other-key')$$),
    ($$fence.current_fence('other-key')$$),
    ($$(SELECT string_agg(key, ',') FROM fence.leases WHERE live AND key LIKE '%r-key')$$),
    ($$fence.fence_guard('mallory-key', @fence@)$$),
    ($$fence.fence_guard('mallory-key', @fence@ - -1)$$),
    ($$fence.fence_guard('other-key', 0)$$),
    ($$fence.fence_holds('mallory-key', 0)$$),
    ($$fence.fenced_update('mallory-key', @fence@ - -1, 'accounts', '{"balance": 0}', '{"id": 1}')$$),
    ($$fence.fenced_update('mallory-key', @fence@, 'accounts', '{"balance": 1}', '{"id": 1}')$$),
    ($$fence.fenced_update('mallory-key', @fence@, 'accounts', '{"balance": 1}', '{"name": "alice"}')$$),
    ($$fence.fenced_update('mallory-key', @fence@, 'accounts', '{"balance": 1}', '{"id": 3}')$$),
    ($$fence.fenced_write('accounts', 'fence', 4, '{"balance": 0}', '{"id": 1}')$$),
    ($$fence.fenced_write('accounts', 'fence', 6, '{"balance": 1}', '{"id": 1}')$$),
    ($$fence.versioned_update('accounts', 'version', 0, '{"balance": 0}', '{"id": 1}')$$),
    ($$fence.versioned_update('accounts', 'version', 1, '{"balance": 1}', '{"id": 1}')$$),
    ($$fence.enable_versioning('mallory.docs')$$);
UPDATE attack_cases SET call = replace(replace(template, '@fence@', :'m_fence'), '@token@', quote_literal(:'m_token'));

SET ROLE fence_mallory;
INSERT INTO attack_results SELECT 'default', c.n, r.*
  FROM (SELECT * FROM attack_cases ORDER BY n) c, LATERAL attack_case(c.call) r;
SET search_path = mallory, public;
INSERT INTO attack_results SELECT 'mallory first', c.n, r.*
  FROM (SELECT * FROM attack_cases ORDER BY n) c, LATERAL attack_case(c.call) r;
SET search_path = mallory, pg_catalog, public;
INSERT INTO attack_results SELECT 'mallory before pg_catalog', c.n, r.*
  FROM (SELECT * FROM attack_cases ORDER BY n) c, LATERAL attack_case(c.call) r;
SET search_path = pg_temp, pg_catalog, public;
INSERT INTO attack_results SELECT 'pg_temp first', c.n, r.*
  FROM (SELECT * FROM attack_cases ORDER BY n) c, LATERAL attack_case(c.call) r;
RESET search_path;
RESET ROLE;

-- The outcome with the default search_path, and whether each attacked search_path gave the same
-- outcome, value and state: every cell must be t. (An f here is a gap: a core that runs with the
-- caller's rights and builds a statement with an unqualified =, > or +, or a function that calls
-- format() unqualified, loses to an exact-match look-alike such as varchar = varchar even with
-- pg_catalog first. Hence those operators are schema-qualified and the PL/pgSQL functions pin
-- search_path.)
SELECT jsonb_build_object('@fence@', :m_fence, '@fence@ - -1', :m_fence + 1, 'other-key''s fence', :other_fence)
    AS fences \gset
SELECT d.n, c.template AS call,
       named(d.outcome || CASE WHEN d.outcome = 'ok' THEN ': ' || coalesce(d.value, 'NULL') ELSE '' END,
             :'fences') AS outcome,
       bool_and(a.same) FILTER (WHERE a.path = 'mallory first') AS mallory_first,
       bool_and(a.same) FILTER (WHERE a.path = 'mallory before pg_catalog') AS before_pg_catalog,
       bool_and(a.same) FILTER (WHERE a.path = 'pg_temp first') AS pg_temp_first
  FROM attack_results d
  JOIN attack_cases c USING (n)
  JOIN (SELECT r.*, (r.outcome, r.value, r.state) IS NOT DISTINCT FROM (b.outcome, b.value, b.state) AS same
          FROM attack_results r JOIN attack_results b ON b.n = r.n AND b.path = 'default') a USING (n)
 WHERE d.path = 'default'
 GROUP BY d.n, c.template, d.outcome, d.value
 ORDER BY d.n;
-- Where they differ, what the attacked calls did instead.
SELECT a.n, a.path,
       named(a.outcome || CASE WHEN a.outcome = 'ok' THEN ': ' || coalesce(a.value, 'NULL') ELSE '' END,
             :'fences') AS outcome,
       a.state = d.state AS same_state
  FROM attack_results a JOIN attack_results d ON d.n = a.n AND d.path = 'default'
 WHERE a.path <> 'default'
   AND (a.outcome, a.value, a.state) IS DISTINCT FROM (d.outcome, d.value, d.state)
 ORDER BY a.n, a.path;


-- A victim: the superuser, owner of a table, with fence_mallory's schema on its search_path (even
-- last, after pg_catalog). Were fence_mallory's format() to run, it would run with the superuser's
-- rights and make fence_mallory a member of fence_admin; the triggers must be created instead.
CREATE TABLE victim_docs (id int PRIMARY KEY, body text, version bigint NOT NULL DEFAULT 1);
SET search_path = pg_catalog, public, mallory;
SELECT fence.enable_versioning('victim_docs');
RESET search_path;
SELECT count(*) AS versioning_triggers FROM pg_trigger WHERE tgrelid = 'victim_docs'::regclass;
SELECT pg_has_role('fence_mallory', 'fence_admin', 'MEMBER') AS mallory_is_fence_admin;
REVOKE fence_admin FROM fence_mallory;
-- And a filter on a varchar column matches every row, through fence_mallory's varchar = varchar.
SELECT fence AS victim_fence FROM fence.lease_acquire('victim-key', '1 hour', 'victim') \gset
SET search_path = public, mallory;
SELECT fence.fenced_update('victim-key', :victim_fence, 'accounts', '{"balance": 0}', '{"name": "alice"}')
    AS rows_updated;
RESET search_path;
SELECT id, name, balance FROM accounts ORDER BY id;

DROP TABLE ledger, accounts, victim_docs;
DROP FUNCTION attack_case(text), attack_state(bigint, bigint), issued(text, bigint, bigint);
-- fence_mallory's schema, its temporary look-alikes and its grants.
DROP OWNED BY fence_mallory;
DROP ROLE fence_mallory;
DROP EXTENSION pg_fence;
DROP ROLE fence_app;
DROP ROLE fence_other;
