#!/usr/bin/env bash
# Round 12, call 3: gpu_sparse (first run), memcheck on it, run.sh sparse-bench; bench_fft's
# interleaved cache-hit breakdown; gpu_graph_explicit (the while of k steps).
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
tar -xJf target/gpu-bundle.tar.xz -C target
B=$PWD/target/gpu-bundle
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
here=$B; eval "$(sed -n '/^export NCCL_NVLS_ENABLE/,/^test_timeout=/p' $B/run.sh)"
export CUDA_RS_BUNDLE_DIR=$B
echo "=== gpu_sparse"
timeout 200 $B/tests/gpu_sparse --test-threads=1 --nocapture 2>&1 | grep -vE "^$" | tail -60
cs="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
echo "=== memcheck: gpu_sparse  [$(( $(date +%s) - t0 )) s]"
timeout 300 "$cs" --tool memcheck --report-api-errors no --error-exitcode 86 --print-limit 20 $B/tests/gpu_sparse --test-threads=1 > $OUT/memcheck_gpu_sparse.txt 2>&1; echo "rc $?"
grep -E "^test result|ERROR SUMMARY" $OUT/memcheck_gpu_sparse.txt | tail -3
echo "=== sparse-bench  [$(( $(date +%s) - t0 )) s]"
timeout 240 bash $B/run.sh sparse-bench 2>&1 | tail -12
echo "=== bench_fft  [$(( $(date +%s) - t0 )) s]"
timeout 120 $B/bench/bench_fft 2>&1 | tail -5
echo "=== gpu_graph_explicit  [$(( $(date +%s) - t0 )) s]"
timeout 120 $B/tests/gpu_graph_explicit --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED|k_steps" | head
echo "[$(( $(date +%s) - t0 )) s]"
