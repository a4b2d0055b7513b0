-- The SQL edition's own: fence_admin changes the settings (fence.settings, sql/edition/settings.sql).
GRANT SELECT, UPDATE (value) ON fence.settings TO fence_admin;
