#!/usr/bin/env bash
# Call AC (one H200), commit 6a1b27a (review fixes): suite; pool pairs pinned against 1243ff2;
# CuPy's own test files; every CuPy client.
export NCCL_NVLS_ENABLE=0
B=target/gpu-bundle
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s); END=${END:-585}
step() { echo "=== [$(( $(date +%s) - t0 ))s] $1"; }
tl() { local left=$(( END - ($(date +%s) - t0) )); [ "$left" -lt "$1" ] && echo "$left" || echo "$1"; }
tar -xJf target/bisd.tar.xz -C target
step suite; VERBOSE=1 timeout $(tl 160) bash $B/run.sh tests > $OUT/suite.txt 2>&1; echo "rc=$?"
grep -E "^(ok|FAILED) |GPU suite|two-GPU" $OUT/suite.txt
grep -E "out_of_memory_(recovers|does_not)" $OUT/suite.txt | head -3
step pairs; timeout $(tl 60) bash target/gpu-scripts/pairs2.sh 3 6 before=target/bisd/bench_pool_1243ff2 after=$B/bench/bench_pool > $OUT/pairs.txt 2>&1; python3 target/gpu-scripts/summ.py $OUT/pairs.txt
step bench_pool; CUDA_RS_TRACES=$B/traces timeout $(tl 90) $B/bench/bench_pool > $OUT/bench_pool.txt 2>&1; echo "rc=$?"; grep -E "^pool_pair|^pinned|^replay_[a-z_]* " $OUT/bench_pool.txt | cut -c1-150
step cupy-own; timeout $(tl 90) bash $B/cupy_own_tests.sh > $OUT/cupy_own.txt 2>&1; echo "rc=$?"; grep -E "cupy-own-tests on|passed;|passed, " $OUT/cupy_own.txt | tail -6
step clients-cupy; CLIENT_ARGS="--seconds 8" VERBOSE=1 timeout $(tl 250) bash $B/run.sh clients cupy > $OUT/clients_cupy.txt 2>&1; echo "rc=$?"
grep -E "^(ok|FAILED) |--- " $OUT/clients_cupy.txt | cut -c1-220
step end
