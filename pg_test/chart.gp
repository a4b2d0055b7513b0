# The lease benchmark as a chart: pairs/s and p99 latency per system and client count.
# Input: the data file written by pg_test/run-bench (columns: clients system pairs p50 p99);
#   gnuplot -e "data='FILE'; out='docs/bench/leases.png'" pg_test/chart.gp
set terminal pngcairo size 1100,450 font ",10" noenhanced
set output out
set datafile separator "\t"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set key top left
set xlabel "clients"
set grid ytics
set multiplot layout 1,2 title "acquire+release pairs on random keys (PostgreSQL 15, fsync on; 2 CPUs)"
set title "throughput (pairs/s, higher is better)"
set logscale y
plot data using 2:xtic(1) title columnheader(2), '' using 3 title columnheader(3), \
     '' using 4 title columnheader(4), '' using 5 title columnheader(5)
set title "p99 latency of a pair (ms, lower is better)"
plot data using 6:xtic(1) title columnheader(6), '' using 7 title columnheader(7), \
     '' using 8 title columnheader(8), '' using 9 title columnheader(9)
unset multiplot
