-- What an ordinary role can and cannot do.
CREATE EXTENSION pg_fence;
CREATE ROLE fence_app LOGIN;
CREATE ROLE fence_other LOGIN;
SELECT fence.lease_acquire('shared', '1 hour', 'superuser-holder') AS l \gset

SET ROLE fence_app;
-- The functions and the view work for everyone...
SELECT (fence.lease_acquire('app-key', '1 minute', 'app')).fence;
SELECT key, owner, fence, live FROM fence.leases ORDER BY key;
SELECT fence.current_fence('shared');
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
SELECT fence.fence_guard('shared', 1);
SELECT (fence.lease_acquire('shared', '1 minute', 'next-holder')).fence AS next_fence;
RESET ROLE;
REVOKE fence_admin FROM fence_app;

-- Every SECURITY DEFINER function pins search_path.
SELECT p.proname, p.proconfig
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = 'fence' AND p.prosecdef
 ORDER BY 1;

DROP EXTENSION pg_fence;
DROP ROLE fence_app;
DROP ROLE fence_other;
