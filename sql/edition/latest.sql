-- REPEATABLE READ and SERIALIZABLE (docs/sql-edition.md). The extension reads a key's rows, the
-- high-water mark and the fast reservation in the latest committed state (a fresh snapshot,
-- src/pg/one_row.rs, src/leases/state/rows.rs); PL/pgSQL has only the transaction's snapshot, which
-- under those levels may predate the key's latest change. So every call that decides on the key's
-- rows under those levels first makes sure that its snapshot still shows the key as last
-- committed, and fails with 40001 (retry the transaction) when it does not; it never decides on a
-- stale row. The check, in a subtransaction rolled back at once (so that it keeps no row lock and
-- leaves no row):
--   - locks every row of the key that the snapshot shows, in both tables, FOR SHARE: PostgreSQL
--     refuses (40001) to lock a row changed or deleted after the snapshot;
--   - inserts the key's slots 0 to one above the highest it sees into both tables ON CONFLICT DO
--     NOTHING: PostgreSQL refuses (40001) when a row in the way was inserted after the snapshot. A
--     grant takes the lowest free slot (src/leases/state/slots.rs), so a row inserted since at a
--     higher slot found every lower one held: the lowest such slot is at most one above the
--     highest the snapshot shows, unless a row inserted since was deleted again since;
--   - with `high_water`, the same for fence.high_water, which every deletion of a row raises: that
--     case, and a grant's fence, which must be above the mark.
-- Under READ COMMITTED every statement reads the latest committed state: nothing to check.
CREATE FUNCTION fence_internal.require_latest(key text, high_water boolean) RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    top integer;
BEGIN
    IF current_setting('transaction_isolation') = 'read committed' THEN
        RETURN;
    END IF;
    BEGIN
        PERFORM FROM fence.lease_state s WHERE s.key = require_latest.key FOR SHARE;
        PERFORM FROM fence.fast_lease_state s WHERE s.key = require_latest.key FOR SHARE;
        top := greatest((SELECT max(s.slot) FROM fence.lease_state s WHERE s.key = require_latest.key),
                        (SELECT max(s.slot) FROM fence.fast_lease_state s WHERE s.key = require_latest.key));
        INSERT INTO fence.lease_state (key, slot, fence, owner, acquired_at, expires_at)
        SELECT key, n, 0, '', now(), now() FROM generate_series(0, coalesce(top, -1) + 1) n ON CONFLICT DO NOTHING;
        INSERT INTO fence.fast_lease_state (key, slot, fence, owner, acquired_at, expires_at)
        SELECT key, n, 0, '', now(), now() FROM generate_series(0, coalesce(top, -1) + 1) n ON CONFLICT DO NOTHING;
        IF high_water THEN
            PERFORM FROM fence.high_water h FOR SHARE;
            INSERT INTO fence.high_water (one, fence) VALUES (true, 0) ON CONFLICT DO NOTHING;
        END IF;
        RAISE SQLSTATE 'PFZ01';
    EXCEPTION
        WHEN SQLSTATE 'PFZ01' THEN
            RETURN;
        WHEN serialization_failure THEN
            RAISE EXCEPTION 'the lease of key "%" changed after this transaction''s snapshot was taken', key
                USING ERRCODE = '40001',
                      DETAIL = 'Under REPEATABLE READ or SERIALIZABLE the SQL edition of pg_fence decides only on the key''s latest committed state, which this snapshot does not show.',
                      HINT = 'Retry the transaction, or call it in READ COMMITTED.';
        WHEN read_only_sql_transaction THEN
            RAISE EXCEPTION 'the SQL edition of pg_fence cannot check the lease of key "%" in a read-only % transaction',
                            key, upper(current_setting('transaction_isolation'))
                USING ERRCODE = '25006',
                      HINT = 'Under REPEATABLE READ or SERIALIZABLE it checks the key''s rows with row locks: call it in a read-write transaction, or in READ COMMITTED.';
    END;
END
$$;
