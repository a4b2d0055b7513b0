-- The same plain UPDATE with fence_guard in its WHERE clause.
\set id random(1, 10000)
\set v random(1, 1000000)
UPDATE bench_rows SET value = :v WHERE id = :id AND fence.fence_guard('bench-writer', :fence);
