#!/usr/bin/env bash
# Round 13, call 1: surviving a device fault (#54, first part). gpu_fault_reset (20 faults,
# 8 threads each, reset, old handles fail closed, fresh workload checked, memory levels); the
# fault_service example; gpu_async_fault in both modes (faults now come back as ContextLost);
# the whole GPU suite (the generation checks sit on every call path); bench_core (launch and
# stream overheads against the raw driver: the in-call count is new on those paths).
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
tar -xJf target/gpu-bundle.tar.xz -C target
B=$PWD/target/gpu-bundle
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
here=$B; eval "$(sed -n '/^export NCCL_NVLS_ENABLE/,/^test_timeout=/p' $B/run.sh)"
export CUDA_RS_BUNDLE_DIR=$B
echo "=== gpu_fault_reset  [$(( $(date +%s) - t0 )) s]"
timeout 300 $B/tests/gpu_fault_reset --test-threads=1 --nocapture > $OUT/fault_reset.txt 2>&1; echo "rc $?"
grep -E "RESET_ROUND|DEVICE_RESET|test result|panicked|assert" $OUT/fault_reset.txt | head -40
echo "=== fault_service example  [$(( $(date +%s) - t0 )) s]"
timeout 60 $B/examples/fault_service 2>&1 | tee $OUT/fault_service.txt; echo "rc ${PIPESTATUS[0]}"
echo "=== gpu_async_fault  [$(( $(date +%s) - t0 )) s]"
timeout 120 $B/tests/gpu_async_fault --test-threads=1 --nocapture > $OUT/async_fault.txt 2>&1; echo "rc $?"
grep -E "fault timings|first error|test result|panicked" $OUT/async_fault.txt | head -10
echo "=== the GPU suite  [$(( $(date +%s) - t0 )) s]"
timeout 420 bash $B/run.sh tests > $OUT/suite.txt 2>&1; grep -E "^(ok|FAILED)|GPU suite" $OUT/suite.txt | grep -vE "^ok "; grep -E "GPU suite" $OUT/suite.txt
grep -B2 -A25 "panicked" $OUT/suite.txt | head -60
echo "=== bench_core  [$(( $(date +%s) - t0 )) s]"
timeout 120 $B/bench/bench_core > $OUT/bench_core.txt 2>&1; echo "rc $?"
head -40 $OUT/bench_core.txt
echo "[$(( $(date +%s) - t0 )) s]"
