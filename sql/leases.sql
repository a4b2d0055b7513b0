-- lease_renew: a SQL shell over the Rust core (src/leases.rs), for its own SQLSTATE (README "Errors").
-- It is a shell because pgrx can raise only the SQLSTATEs in its closed
-- PgSqlErrorCode enum (any other code becomes XX000), while PL/pgSQL can raise any code.

CREATE FUNCTION fence.lease_renew(key text, token uuid, ttl interval)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    new_expiry timestamptz := fence.renew_if_held(key, token, ttl);
BEGIN
    IF new_expiry IS NULL THEN
        RAISE EXCEPTION 'lease on key "%" is lost', key
            USING ERRCODE = 'PF001',
                  DETAIL = 'The token is not the live holder''s: the lease was released, taken over, or has expired.',
                  HINT = 'Stop work done under this lease and acquire the key again; expired leases are never revived.';
    END IF;
    RETURN new_expiry;
END
$$;

-- The Rust core trusts its callers; only the shells above (running as the extension owner) call it.
REVOKE ALL ON FUNCTION fence.renew_if_held(text, uuid, interval) FROM PUBLIC;
