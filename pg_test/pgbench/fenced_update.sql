-- The same write through fenced_update, under the live fence of key bench-writer (-D fence=N).
\set id random(1, 10000)
\set v random(1, 1000000)
SELECT fence.fenced_update('bench-writer', :fence, 'bench_rows',
                           jsonb_build_object('value', :v::int), jsonb_build_object('id', :id::int));
