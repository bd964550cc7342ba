#!/usr/bin/env bash
# Round 12, call 2: gpu_solver after the launch refactor (potri, ormqr, the Jacobi routines
# and their batched forms, the captured solves), memcheck on it, run.sh solver-bench,
# bench_fft's cache-hit breakdown.
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
tar -xJf target/gpu-bundle.tar.xz -C target
B=$PWD/target/gpu-bundle
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
here=$B; eval "$(sed -n '/^export NCCL_NVLS_ENABLE/,/^test_timeout=/p' $B/run.sh)"
export CUDA_RS_BUNDLE_DIR=$B
echo "=== gpu_solver"
timeout 200 $B/tests/gpu_solver --test-threads=1 --nocapture 2>&1 | grep -vE "^$" | tail -50
cs="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
echo "=== memcheck: gpu_solver  [$(( $(date +%s) - t0 )) s]"
timeout 300 "$cs" --tool memcheck --report-api-errors no --error-exitcode 86 --print-limit 20 $B/tests/gpu_solver --test-threads=1 > $OUT/memcheck_gpu_solver.txt 2>&1; echo "rc $?"
grep -E "^test result|ERROR SUMMARY" $OUT/memcheck_gpu_solver.txt | tail -3
echo "=== fft-bench  [$(( $(date +%s) - t0 )) s]"
timeout 120 bash $B/run.sh fft-bench 2>&1 | tail -12
echo "=== solver-bench  [$(( $(date +%s) - t0 )) s]"
timeout 280 bash $B/run.sh solver-bench 2>&1 | tail -14
echo "[$(( $(date +%s) - t0 )) s]"
