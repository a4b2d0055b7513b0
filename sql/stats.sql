-- fence.stats: the counters of src/stats.rs, one row. Without pg_fence in shared_preload_libraries
-- they are not kept: available is false and every other column NULL. Figures only (no key, no
-- token), so readable by all, as fence.sweeper is.
CREATE VIEW fence.stats AS
SELECT available, since,
       c[1] AS grants_durable, c[2] AS grants_fast, c[3] AS acquires_refused,
       c[4] AS renewals, c[5] AS renewals_lost, c[6] AS releases, c[7] AS releases_stale,
       c[8] AS expiries_swept, c[9] AS revocations, c[10] AS session_ends,
       c[11] AS waits_begun, c[12] AS waits_granted, c[13] AS waits_timed_out,
       c[14]::float8 / 1000 AS wait_time_total_ms, c[15]::float8 / 1000 AS wait_time_max_ms,
       c[16] AS guards_accepted, c[17] AS guards_refused
  FROM fence.stats_values() AS s(available, since, c);
