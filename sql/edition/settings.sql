-- Settings (docs/sql-edition.md): no C GUCs here, and a pg_fence.* placeholder that any session
-- may SET is no limit (max_ttl). So they live in this table, per database: every role reads them
-- through the functions, fence_admin changes them with UPDATE (sql/edition/privileges.sql), and
-- the CHECK keeps each one a value of its type.
CREATE TABLE fence.settings (
    name  text PRIMARY KEY,
    value text NOT NULL,
    CHECK (CASE name
             WHEN 'max_ttl' THEN value::interval > '0'
             WHEN 'retain_ended' THEN value::interval >= '0'
             WHEN 'observe_interval' THEN value::interval >= '0'
             WHEN 'notify' THEN value::boolean IS NOT NULL
             WHEN 'notify_keys' THEN value::boolean IS NOT NULL
             ELSE false END)
);
INSERT INTO fence.settings VALUES
    ('max_ttl', '1 day'), ('retain_ended', '1 hour'), ('observe_interval', '50 milliseconds'),
    ('notify', 'off'), ('notify_keys', 'off');
REVOKE ALL ON fence.settings FROM PUBLIC;

-- One setting's value.
CREATE FUNCTION fence.setting(name text) RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ SELECT s.value FROM fence.settings s WHERE s.name = setting.name $$;
