-- pg_fence 0.4.0 -> 0.5.0 (ALTER EXTENSION pg_fence UPDATE). While 0.5.0 is unreleased, every change to
-- its SQL objects extends this script in the same commit (CONTRIBUTING.md, "Upgrade scripts").

-- Lease sets (src/leases/sets.rs).
CREATE FUNCTION fence.lease_acquire_all(
	"keys" TEXT[],
	"ttl" interval,
	"owner" TEXT DEFAULT NULL,
	"wait" interval DEFAULT '0',
	"session_bound" bool DEFAULT false,
	"durable" bool DEFAULT true
) RETURNS SETOF fence.lease
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'lease_acquire_all_wrapper';

CREATE FUNCTION fence.lease_release_all(
	"keys" TEXT[],
	"token" uuid
) RETURNS INT
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'lease_release_all_wrapper';

CREATE FUNCTION fence.renew_all_if_held(
	"keys" TEXT[],
	"token" uuid,
	"ttl" interval
) RETURNS timestamp with time zone
VOLATILE SECURITY DEFINER PARALLEL UNSAFE
SET search_path TO pg_catalog, pg_temp
LANGUAGE c
AS 'MODULE_PATHNAME', 'renew_all_if_held_wrapper';

CREATE FUNCTION fence.lease_renew_all(keys text[], token uuid, ttl interval)
RETURNS timestamptz
LANGUAGE sql VOLATILE
AS $$ SELECT coalesce(fence.renew_all_if_held(keys, token, ttl),
                      fence.raise_lease_lost(pg_catalog.array_to_string(keys, ', '))) $$;

COMMENT ON FUNCTION fence.renew_all_if_held(text[], uuid, interval) IS
    'pg_fence internal: the core of fence.lease_renew_all; not part of the API';

REVOKE EXECUTE ON FUNCTION fence.lease_acquire_all(text[], interval, text, interval, boolean, boolean),
    fence.lease_release_all(text[], uuid), fence.renew_all_if_held(text[], uuid, interval),
    fence.lease_renew_all(text[], uuid, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fence.lease_acquire_all(text[], interval, text, interval, boolean, boolean),
    fence.lease_release_all(text[], uuid), fence.renew_all_if_held(text[], uuid, interval),
    fence.lease_renew_all(text[], uuid, interval) TO fence_user;
