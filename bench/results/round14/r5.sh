#!/usr/bin/env bash
# Round 14, call 5 (two H200s, the bundle of call 4, which holds the final code): the whole
# GPU suite with the two-GPU tests, then bench_async (the reactor without its busy phase, at
# 1 waiter and in the pipelines; the diagnostic rows).
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
[ -d target/gpu-bundle ] || tar -xJf target/gpu-bundle.tar.xz -C target
B=$PWD/target/gpu-bundle
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
here=$B; eval "$(sed -n '/^export NCCL_NVLS_ENABLE/,/^test_timeout=/p' $B/run.sh)"
export CUDA_RS_BUNDLE_DIR=$B
echo "=== the GPU suite, two-GPU tests included  [$(( $(date +%s) - t0 )) s]"
VERBOSE=1 timeout 300 bash $B/run.sh tests > $OUT/suite.txt 2>&1; echo "rc $?"
grep -E "^(ok|FAILED)|GPU suite|^---" $OUT/suite.txt | grep -vE "^ok "
grep -B2 -A25 "panicked" $OUT/suite.txt | grep -v "gpu_stream_event.rs:323\|deliberate panic\|^    |    [0-9]: \|callback\|rust_begin_unwind\|panic_fmt" | head -40
echo "=== bench_async  [$(( $(date +%s) - t0 )) s]"
timeout $(( 540 - ($(date +%s) - t0) )) $B/bench/bench_async > $OUT/bench_async.txt 2>&1; echo "rc $?"
grep -E "^wake_median|^wake_p99_warm|^wait_cpu_(parked|warm)|^pipeline|^--|^reactor" $OUT/bench_async.txt
echo "[$(( $(date +%s) - t0 )) s]"
