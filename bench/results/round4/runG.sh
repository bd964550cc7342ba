#!/usr/bin/env bash
# Call G (one H200): the final bundle's suite, examples (memviz with PyTorch's memory_viz),
# the CuPy history client, gpu_async three more times, and the pool pairs once more.
export NCCL_NVLS_ENABLE=0
B=target/gpu-bundle
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s); END=${END:-560}
step() { echo "=== [$(( $(date +%s) - t0 ))s] $1"; }
tl() { local left=$(( END - ($(date +%s) - t0) )); [ "$left" -lt "$1" ] && echo "$left" || echo "$1"; }
tar -xJf target/bb.tar.xz -C target
step suite; VERBOSE=1 timeout $(tl 200) bash $B/run.sh tests > $OUT/suite.txt 2>&1; echo "rc=$?"
grep -E "^(ok|FAILED) |GPU suite|two-GPU" $OUT/suite.txt
grep -E "stolen|0 of" $OUT/suite.txt | head -3
step examples; timeout $(tl 150) bash $B/run.sh examples > $OUT/examples.txt 2>&1; echo "exits: $(grep -c '(exit 0)' $OUT/examples.txt) zero, nonzero: $(grep '(exit [1-9]' $OUT/examples.txt | wc -l)"; grep -A12 "=== memviz" $OUT/examples.txt | head -14
step history-client; CLIENT_ARGS="--only history" VERBOSE=1 timeout $(tl 120) bash $B/run.sh clients cupy > $OUT/clients_history.txt 2>&1; echo "rc=$?"; grep -E "^(ok|FAILED)|GPU suite|PASS|FAIL" $OUT/clients_history.txt | cut -c1-200 | head -12
step gpu_async; for i in 1 2 3; do timeout 60 $B/tests/gpu_async --test-threads=1 2>&1 | grep -E "test result"; done
step sanitize-async; cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer); CUDA_RS_ASYNC_FUTURES=1000 timeout $(tl 120) $cs --tool memcheck --report-api-errors no --error-exitcode 86 $B/tests/gpu_async --test-threads=1 > $OUT/sanitize_async.txt 2>&1; echo "rc=$? $(grep -E '^test result' $OUT/sanitize_async.txt | tail -1) $(grep 'ERROR SUMMARY' $OUT/sanitize_async.txt | tail -1)"
step pairs; timeout $(tl 120) bash target/gpu-scripts/pairs2.sh 4 6 presplit=target/bb/bench_pool_presplit head=$B/bench/bench_pool > $OUT/pairs.txt 2>&1; python3 target/gpu-scripts/summ.py $OUT/pairs.txt
step end
