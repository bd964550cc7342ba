#!/usr/bin/env bash
# Call P (one H200): suite; pool pairs presplit / HEAD with 16 codegen units / HEAD with one
# (the bundle) / HEAD with one and fat LTO, interleaved; bench_pool whole; bench_rtc with peers.
export NCCL_NVLS_ENABLE=0
B=target/gpu-bundle
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s); END=${END:-570}
step() { echo "=== [$(( $(date +%s) - t0 ))s] $1"; }
tl() { local left=$(( END - ($(date +%s) - t0) )); [ "$left" -lt "$1" ] && echo "$left" || echo "$1"; }
tar -xJf target/bb.tar.xz -C target
step suite; VERBOSE=1 timeout $(tl 200) bash $B/run.sh tests > $OUT/suite.txt 2>&1; echo "rc=$?"
grep -E "^(ok|FAILED) |GPU suite|two-GPU" $OUT/suite.txt
step pairs; timeout $(tl 200) bash target/gpu-scripts/pairs2.sh 5 8 presplit=target/bb/bench_pool_presplit cgu16=target/gpu-scripts/bb2/bench_pool_cgu16 cgu1=$B/bench/bench_pool lto=target/gpu-scripts/bb2/bench_pool_lto > $OUT/pairs.txt 2>&1; python3 target/gpu-scripts/summ.py $OUT/pairs.txt
step bench_pool; timeout $(tl 100) $B/bench/bench_pool > $OUT/bench_pool.txt 2>&1; echo "rc=$?"; grep -E "^pool_pair|history|scenario" $OUT/bench_pool.txt | cut -c1-160
step rtc-bench; timeout $(tl 150) bash $B/run.sh rtc-bench > $OUT/rtc_bench.txt 2>&1; grep -E "rtc " $OUT/rtc_bench.txt | head -20
step end
