#!/usr/bin/env bash
# Round 14, call 1: what is owed since d1c067a. Which cheap driver calls report a sticky
# error (fault_calls.py, libcuda alone); the whole GPU suite, verbose (gpu_fault_reset's floor
# path); bench_core (the in-call counting's cost); the fault_service example.
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
tar -xJf target/gpu-bundle.tar.xz -C target
B=$PWD/target/gpu-bundle
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
here=$B; eval "$(sed -n '/^export NCCL_NVLS_ENABLE/,/^test_timeout=/p' $B/run.sh)"
export CUDA_RS_BUNDLE_DIR=$B
echo "=== fault calls  [$(( $(date +%s) - t0 )) s]"
timeout 60 python3 bench/results/round14/fault_calls.py 2>&1 | tee $OUT/fault_calls.txt
echo "=== fault_service example  [$(( $(date +%s) - t0 )) s]"
timeout 30 $B/examples/fault_service 2>&1 | tee $OUT/fault_service.txt; echo "rc ${PIPESTATUS[0]}"
echo "=== the GPU suite  [$(( $(date +%s) - t0 )) s]"
VERBOSE=1 timeout 240 bash $B/run.sh tests > $OUT/suite.txt 2>&1
grep -E "^(ok|FAILED)|GPU suite" $OUT/suite.txt | grep -vE "^ok "
grep -E "FAULT_ROUND|RESET_ROUND (0|1|19) |DEVICE_RESET|threads got|GPU suite" $OUT/suite.txt | sed 's/^ *| *//' | head -12
grep -B2 -A20 "panicked" $OUT/suite.txt | grep -v "gpu_stream_event.rs:323" | head -60
echo "=== bench_core  [$(( $(date +%s) - t0 )) s]"
timeout 120 $B/bench/bench_core > $OUT/bench_core.txt 2>&1; echo "rc $?"
cat $OUT/bench_core.txt | tail -40
echo "[$(( $(date +%s) - t0 )) s]"
