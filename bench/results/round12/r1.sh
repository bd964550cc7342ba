#!/usr/bin/env bash
# Round 12, call 1: the whole GPU suite (first run of gpu_solver; gpu_fft after the cache fix),
# gpu_solver verbose, memcheck on gpu_fft and gpu_solver, run.sh fft-bench.
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
tar -xJf target/gpu-bundle.tar.xz -C target
B=$PWD/target/gpu-bundle
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "=== the GPU suite"
timeout 300 bash $B/run.sh tests > $OUT/suite.txt 2>&1; grep -E "^(ok|FAILED)|GPU suite" $OUT/suite.txt | grep -vE "^ok " ; grep -E "gpu_solver|gpu_fft|gpu_gpt2|GPU suite" $OUT/suite.txt
grep -B2 -A30 "panicked" $OUT/suite.txt | head -80
here=$B; eval "$(sed -n '/^export NCCL_NVLS_ENABLE/,/^test_timeout=/p' $B/run.sh)"
export CUDA_RS_BUNDLE_DIR=$B
echo "=== gpu_solver verbose [$(( $(date +%s) - t0 )) s]"
timeout 120 $B/tests/gpu_solver --test-threads=1 --nocapture 2>&1 | grep -vE "^$" | tail -40
cs="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
for t in gpu_fft gpu_solver; do
  echo "=== memcheck: $t  [$(( $(date +%s) - t0 )) s]"
  timeout 200 "$cs" --tool memcheck --report-api-errors no --error-exitcode 86 --print-limit 20 $B/tests/$t --test-threads=1 > $OUT/memcheck_$t.txt 2>&1; echo "rc $?"
  grep -E "^test result|ERROR SUMMARY" $OUT/memcheck_$t.txt | tail -3
done
echo "=== fft-bench  [$(( $(date +%s) - t0 )) s]"
timeout 120 bash $B/run.sh fft-bench 2>&1 | tail -12
echo "[$(( $(date +%s) - t0 )) s]"
