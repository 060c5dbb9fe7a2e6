set terminal pngcairo size 1400,600 font ",10" noenhanced
set output '/work/main/docs/bench/e2e_large_2threads_avx2.png'
set multiplot layout 1,2 title "deepinfer bench e2e — large; triad 47.6 GB/s; batch-1 decode 53.5% of triad"
set title "tokens/s by batch size"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8
set logscale y
set ylabel "tok/s"
set xlabel "batch"
plot '/work/main/docs/bench/e2e_large_2threads_avx2.tps.dat' using 2:xtic(1) title "prefill", '' using 3 title "decode"
unset logscale y
set title "batch-1 decode time by region (%)"
set style data histograms
set style histogram rowstacked
set ylabel "% of decode step"
set xlabel ""
set xtics rotate by -35 left
plot '/work/main/docs/bench/e2e_large_2threads_avx2.regions.dat' using 2:xtic(1) notitle lc rgb "#4477aa"
unset multiplot
