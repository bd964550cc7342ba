#!/usr/bin/env bash
# Round 12, call 5: the whole GPU suite after the review fixes (cuda-fft: graphs keep the
# plan's handle, eager/captured stream ordering, half precision; cuda-solver: Pivots, per-
# capture info words, the handle kept by graphs, a 2048 x 2048 captured solve); memcheck on
# gpu_fft, gpu_solver, gpu_sparse; bench_async with its floor rows; bench_fft.
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
tar -xJf target/gpu-bundle.tar.xz -C target
B=$PWD/target/gpu-bundle
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "=== the GPU suite"
timeout 330 bash $B/run.sh tests > $OUT/suite.txt 2>&1; grep -E "^(ok|FAILED)|GPU suite" $OUT/suite.txt | grep -vE "^ok "; grep -E "gpu_solver|gpu_fft|gpu_sparse|gpu_async|GPU suite" $OUT/suite.txt
grep -B2 -A25 "panicked" $OUT/suite.txt | head -60
here=$B; eval "$(sed -n '/^export NCCL_NVLS_ENABLE/,/^test_timeout=/p' $B/run.sh)"
export CUDA_RS_BUNDLE_DIR=$B
echo "=== solver and fft lines [$(( $(date +%s) - t0 )) s]"
timeout 120 $B/tests/gpu_solver --test-threads=1 --nocapture 2>&1 | grep -E "replay|LU graph|free memory|test result" | head -12
timeout 120 $B/tests/gpu_fft --test-threads=1 --nocapture 2>&1 | grep -E "after the plans|f16|test result" | head -8
cs="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
for t in gpu_fft gpu_solver gpu_sparse; do
  echo "=== memcheck: $t  [$(( $(date +%s) - t0 )) s]"
  timeout 240 "$cs" --tool memcheck --report-api-errors no --error-exitcode 86 --print-limit 20 $B/tests/$t --test-threads=1 > $OUT/memcheck_$t.txt 2>&1; echo "rc $?"
  grep -E "^test result|ERROR SUMMARY" $OUT/memcheck_$t.txt | tail -3
done
echo "=== bench_async  [$(( $(date +%s) - t0 )) s]"
timeout 240 $B/bench/bench_async > $OUT/bench_async.txt 2>&1; echo "rc $?"
grep -E "^wake_median|^wake_p99_warm|^wake_p99_over|^wait_cpu_(parked|warm)|^pipeline|^--" $OUT/bench_async.txt
echo "=== bench_fft  [$(( $(date +%s) - t0 )) s]"
timeout 60 $B/bench/bench_fft 2>&1 | tail -3
echo "[$(( $(date +%s) - t0 )) s]"
