#!/usr/bin/env bash
# Round 12, call 4: #53's warm wake path (gpu_async in both modes, the fault test in both
# modes, bench_async); gpu_fft with half precision and memcheck on it; bench_fft under perf
# when the machine has it.
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
tar -xJf target/gpu-bundle.tar.xz -C target
B=$PWD/target/gpu-bundle
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
here=$B; eval "$(sed -n '/^export NCCL_NVLS_ENABLE/,/^test_timeout=/p' $B/run.sh)"
export CUDA_RS_BUNDLE_DIR=$B
echo "=== gpu_async"
timeout 240 $B/tests/gpu_async --test-threads=1 --nocapture > $OUT/gpu_async.txt 2>&1; echo "rc $?"
grep -E "^test |test result|panicked" $OUT/gpu_async.txt | tail -40
echo "=== gpu_async_fault  [$(( $(date +%s) - t0 )) s]"
timeout 120 $B/tests/gpu_async_fault --test-threads=1 --nocapture > $OUT/gpu_async_fault.txt 2>&1; echo "rc $?"
grep -E "fault timings|test result|panicked" $OUT/gpu_async_fault.txt | tail -8
echo "=== bench_async  [$(( $(date +%s) - t0 )) s]"
timeout 300 $B/bench/bench_async > $OUT/bench_async.txt 2>&1; echo "rc $?"
tail -60 $OUT/bench_async.txt
echo "=== gpu_fft  [$(( $(date +%s) - t0 )) s]"
timeout 120 $B/tests/gpu_fft --test-threads=1 --nocapture 2>&1 | grep -E "f16|test result|panicked" | tail -8
cs="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
timeout 200 "$cs" --tool memcheck --report-api-errors no --error-exitcode 86 --print-limit 20 $B/tests/gpu_fft --test-threads=1 > $OUT/memcheck_gpu_fft.txt 2>&1; echo "memcheck rc $?"
grep -E "^test result|ERROR SUMMARY" $OUT/memcheck_gpu_fft.txt | tail -3
echo "=== perf?  [$(( $(date +%s) - t0 )) s]"
if command -v perf >/dev/null; then
  timeout 60 perf record -g -o $OUT/perf.data $B/bench/bench_fft > /dev/null 2>&1
  perf report -i $OUT/perf.data --no-children --sort symbol --stdio 2>/dev/null | grep -v "^#" | grep -v "^$" | head -40
else echo "no perf"; fi
echo "[$(( $(date +%s) - t0 )) s]"
