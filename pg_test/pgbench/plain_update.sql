-- The baseline write: a plain UPDATE of one row by primary key.
\set id random(1, 10000)
\set v random(1, 1000000)
UPDATE bench_rows SET value = :v WHERE id = :id;
