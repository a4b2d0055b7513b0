-- Hot key, the floor: every client waits in pg_advisory_lock for the same key, holds it for one round
-- trip, and unlocks it.
SELECT pg_advisory_lock(42);
SELECT pg_advisory_unlock(42);
