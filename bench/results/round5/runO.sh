#!/usr/bin/env bash
# Call O (one H200): suite (the launch context note, the per-thread issue flags), bench_rtc
# with its peers, the pool pairs against presplit, the CuPy plain route's first touch.
export NCCL_NVLS_ENABLE=0
B=target/gpu-bundle
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s); END=${END:-560}
step() { echo "=== [$(( $(date +%s) - t0 ))s] $1"; }
tl() { local left=$(( END - ($(date +%s) - t0) )); [ "$left" -lt "$1" ] && echo "$left" || echo "$1"; }
tar -xJf target/bb.tar.xz -C target
step suite; VERBOSE=1 timeout $(tl 200) bash $B/run.sh tests > $OUT/suite.txt 2>&1; echo "rc=$?"
grep -E "^(ok|FAILED) |GPU suite|two-GPU" $OUT/suite.txt
grep -E "panicked|launches_survive" $OUT/suite.txt | head -8 | cut -c1-300
step rtc-bench; timeout $(tl 150) bash $B/run.sh rtc-bench > $OUT/rtc_bench.txt 2>&1; grep -E "rtc |NO|yes" $OUT/rtc_bench.txt | head -20
step pairs; timeout $(tl 150) bash target/gpu-scripts/pairs2.sh 4 8 presplit=target/bb/bench_pool_presplit head=$B/bench/bench_pool > $OUT/pairs.txt 2>&1; python3 target/gpu-scripts/summ.py $OUT/pairs.txt
step end
