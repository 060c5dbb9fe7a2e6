set terminal pngcairo size 1400,600 font ",10" noenhanced
set output 'docs/bench/e2e_v4_large_1thread.png'
set multiplot layout 1,1 title "deepinfer bench e2e — /tmp/v4fast_large; triad 37.5 GB/s; batch-1 decode 40.3% of triad"
set title "tokens/s by batch size"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8
set logscale y
set ylabel "tok/s"
set xlabel "batch"
plot 'docs/bench/e2e_v4_large_1thread.tps.dat' using 2:xtic(1) title "prefill", '' using 3 title "decode"
unset multiplot
