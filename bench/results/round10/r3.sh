#!/usr/bin/env bash
# Round 10, call 3 (after the review fixes): the whole GPU suite, gpu_blas and gpu_rand under compute-sanitizer memcheck,
# the MLP example, and run.sh blas-bench (bench_blas beside torch and CuPy).
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
tar -xJf target/gpu-bundle.tar.xz -C target
B=target/gpu-bundle
cp tests/bundle/*.py $B/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "=== the GPU suite"
timeout 240 bash $B/run.sh tests > $OUT/suite.txt 2>&1; grep -E "^(ok|FAILED)|GPU suite" $OUT/suite.txt | grep -vE "^ok " ; grep -E "gpu_blas|gpu_rand|GPU suite" $OUT/suite.txt
grep -A30 "^FAILED" $OUT/suite.txt | head -60
here=$B; eval "$(sed -n '/^export NCCL_NVLS_ENABLE/,/^test_timeout=/p' $B/run.sh)"
cs="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
for t in gpu_blas gpu_rand; do
  echo "=== memcheck: $t  [$(( $(date +%s) - t0 )) s]"
  timeout 200 "$cs" --tool memcheck --report-api-errors no --error-exitcode 86 --print-limit 20 $B/tests/$t --test-threads=1 > $OUT/memcheck_$t.txt 2>&1; echo "rc $?"
  grep -E "^test result|ERROR SUMMARY" $OUT/memcheck_$t.txt | tail -3
done
echo "=== mlp  [$(( $(date +%s) - t0 )) s]"
timeout 60 $B/examples/mlp 2>&1 | tail -3
echo "=== blas-bench  [$(( $(date +%s) - t0 )) s]"
timeout 200 bash $B/run.sh blas-bench 2>&1 | tee $OUT/bench_blas.txt
echo "[$(( $(date +%s) - t0 )) s]"
