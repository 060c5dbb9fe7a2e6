set terminal pngcairo size 1400,600 font ",10" noenhanced
set output '/work/main/docs/bench/kernels_2threads_avx2.png'
set multiplot layout 1,2 title "deepinfer bench kernels — AMD EPYC, 2 threads, AVX2"
set title "GEMV (decode, M=1): GB/s; triad 48.0 GB/s"
set style fill solid 0.8
set boxwidth 0.7
set yrange [0:*]
set xtics rotate by -35 left
set rmargin 8
set ylabel "GB/s"
set key top right
plot '/work/main/docs/bench/kernels_2threads_avx2.gemv.dat' using 0:2:xtic(1) with boxes lc rgb "#4477aa" title "kernel", \
     48.00514467009946 with lines lw 2 lc rgb "#cc3311" title "STREAM triad", \
     57.06664644978207 with lines lw 1 dt 2 lc rgb "#ee7733" title "STREAM copy"
set title "GEMM (prefill), N=2304 K=5120: GFLOP/s"
set xtics norotate
set logscale x 2
set xlabel "M (tokens)"
set ylabel "GFLOP/s"
set key top left
plot '/work/main/docs/bench/kernels_2threads_avx2.gemm.dat' using 1:2 with linespoints lw 2 title "fp8", \
     '' using 1:3 with linespoints lw 2 title "fp4", \
     '' using 1:4 with linespoints lw 2 title "bf16", \
     '' using 1:5 with linespoints lw 2 dt 2 lc rgb "black" title "OpenBLAS sgemm (FP32)"
unset multiplot
