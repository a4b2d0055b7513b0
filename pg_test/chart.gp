# The lease benchmark as a chart: pairs/s and p99 latency per system and client count.
# Input: the data file written by pg_test/run-bench (tab-separated columns: clients, then pairs/s of
# each of the N systems, then p99 of each);
#   gnuplot -e "data='FILE'; out='docs/bench/leases.png'; systems=N; what='few keys'" pg_test/chart.gp
set terminal pngcairo size 1100,500 font ",10" noenhanced
set output out
set datafile separator "\t"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set key below horizontal
# Nine systems: gnuplot's default colours cycle after eight.
set linetype 9 lc rgb "#8b4513"
set xlabel "clients"
set grid ytics
set multiplot layout 1,2 title "acquire+release pairs, ".what." (fsync on; 2 CPUs)"
set title "throughput (pairs/s, higher is better)"
set logscale y
plot for [i=2:systems+1] data using i:xtic(1) title columnheader(i)
set title "p99 latency of a pair (ms, lower is better)"
plot for [i=systems+2:2*systems+1] data using i:xtic(1) title columnheader(i)
unset multiplot
