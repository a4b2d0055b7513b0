-- The same fenced lease done by hand in plain SQL (ShedLock style), on table bench_lease.
-- A held key makes the INSERT return no row, but \gset needs exactly one: fall back to a random token.
\set k random(1, 100000)
WITH acq AS (
    INSERT INTO bench_lease AS l (key, fence, token, expires_at)
    VALUES ('k' || :k, 1, gen_random_uuid(), clock_timestamp() + interval '30 seconds')
    ON CONFLICT (key) DO UPDATE
       SET fence = l.fence + 1, token = excluded.token, expires_at = excluded.expires_at
     WHERE l.expires_at <= clock_timestamp() OR l.token IS NULL
    RETURNING fence, token)
SELECT coalesce((SELECT token FROM acq), gen_random_uuid()) AS tok \gset
UPDATE bench_lease SET token = NULL, expires_at = clock_timestamp() WHERE key = 'k' || :k AND token = :tok;
