#!/usr/bin/env bash
# Round 15, call 3 (2 x H200): the review fixes (the call lock's guard, fences of every use
# of a registered view, captures keep registrations, a pool churning segments on another
# thread): the registered worker with NCCL's REG log, the whole cuda-nccl suite,
# bench_nccl --registered, then the GPU suite.
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
tar -xJf target/gpu-bundle.tar.xz -C target
B=$PWD/target/gpu-bundle
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
here=$B; eval "$(sed -n '/^export NCCL_NVLS_ENABLE/,/^test_timeout=/p' $B/run.sh)"
export CUDA_RS_BUNDLE_DIR=$B
echo "=== registered worker with NCCL_DEBUG_SUBSYS=REG  [$(( $(date +%s) - t0 )) s]"
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=REG VERBOSE=1 timeout 150 bash $B/run.sh nccl multi_process_registered > $OUT/registered_reg_log.txt 2>&1; echo "rc $?"
grep -E "REGISTERED_OK|registered pool|replays|deregistered|GPU suite" $OUT/registered_reg_log.txt | head -12
grep -B3 -A12 "panicked" $OUT/registered_reg_log.txt | head -40
echo "register lines: $(grep -c 'NCCL INFO register comm' $OUT/registered_reg_log.txt)"
echo "=== bench_nccl --registered  [$(( $(date +%s) - t0 )) s]"
timeout 150 $B/bench/bench_nccl --registered > $OUT/bench_nccl--registered.txt 2>&1; echo "rc $?"
grep -A40 "^    size" $OUT/bench_nccl--registered.txt | head -34
grep -A8 "launch cost taken away" $OUT/bench_nccl--registered.txt
grep -E "NO" $OUT/bench_nccl--registered.txt | grep -v "vs plain" | head
echo "=== run.sh nccl tests  [$(( $(date +%s) - t0 )) s]"
VERBOSE=1 timeout 220 bash $B/run.sh nccl tests > $OUT/nccl_tests.txt 2>&1; echo "rc $?"
grep -E "^(ok|FAILED)|GPU suite|panicked" $OUT/nccl_tests.txt | head -20
left=$(( 560 - ($(date +%s) - t0) ))
echo "=== the GPU suite (timeout $left s)  [$(( $(date +%s) - t0 )) s]"
VERBOSE=1 timeout $left bash $B/run.sh tests > $OUT/suite.txt 2>&1; echo "rc $?"
grep -E "^(ok|FAILED)|GPU suite|^---" $OUT/suite.txt | grep -vE "^ok "
echo "[$(( $(date +%s) - t0 )) s]"
