#!/usr/bin/env bash
# Round 12, call 6 (two GPUs): the whole GPU suite with the two-GPU tests after the fixes of
# call 5 (solver info blocks reused, FFT planning refused inside a capture); GPT-2's
# data-parallel tests verbose (each rank's gradients against one GPU's, the ranks' parameters
# bit for bit: never run before); memcheck on gpu_fft and gpu_solver; bench_fft.
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
tar -xJf target/gpu-bundle.tar.xz -C target
B=$PWD/target/gpu-bundle
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "=== the GPU suite"
timeout 420 bash $B/run.sh tests > $OUT/suite.txt 2>&1; grep -E "^(ok|FAILED)|GPU suite|two-GPU" $OUT/suite.txt | grep -vE "^ok "; grep -E "gpu_solver|gpu_fft|gpu_sparse|gpu_async |GPU suite|two-GPU" $OUT/suite.txt
grep -B2 -A25 "panicked" $OUT/suite.txt | head -50
here=$B; eval "$(sed -n '/^export NCCL_NVLS_ENABLE/,/^test_timeout=/p' $B/run.sh)"
export CUDA_RS_BUNDLE_DIR=$B
echo "=== gpu_gpt2 --ignored  [$(( $(date +%s) - t0 )) s]"
timeout 200 $B/tests/gpu_gpt2 --ignored --test-threads=1 --nocapture 2>&1 | grep -E "relative|bit for bit|test result|panicked|FAILED" | head -12
echo "=== solver and fft lines [$(( $(date +%s) - t0 )) s]"
timeout 120 $B/tests/gpu_solver --test-threads=1 --nocapture 2>&1 | grep -E "1,000|replay 0|LU graph|test result" | head -8
timeout 120 $B/tests/gpu_fft --test-threads=1 --nocapture 2>&1 | grep -E "after the plans|test result" | head -4
cs="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
for t in gpu_fft gpu_solver; do
  echo "=== memcheck: $t  [$(( $(date +%s) - t0 )) s]"
  timeout 200 "$cs" --tool memcheck --report-api-errors no --error-exitcode 86 --print-limit 20 $B/tests/$t --test-threads=1 > $OUT/memcheck_$t.txt 2>&1; echo "rc $?"
  grep -E "^test result|ERROR SUMMARY" $OUT/memcheck_$t.txt | tail -3
done
echo "=== bench_fft  [$(( $(date +%s) - t0 )) s]"
timeout 60 $B/bench/bench_fft 2>&1 | tail -3
echo "[$(( $(date +%s) - t0 )) s]"
