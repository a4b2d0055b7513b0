-- Session advisory lock and unlock: no table, no WAL, no fence; the floor for any lock round trip.
\set k random(1, 100000)
SELECT pg_advisory_lock(:k);
SELECT pg_advisory_unlock(:k);
