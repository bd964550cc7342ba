#!/usr/bin/env bash
# Round 15, call 4 (1 x H200): pool blocks exported as file descriptors (gpu_ipc's pool block
# test for both kinds), then the GPU suite with what time is left.
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
tar -xJf target/gpu-bundle.tar.xz -C target
B=$PWD/target/gpu-bundle
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
here=$B; eval "$(sed -n '/^export NCCL_NVLS_ENABLE/,/^test_timeout=/p' $B/run.sh)"
export CUDA_RS_BUNDLE_DIR=$B
echo "=== pool blocks over IPC  [$(( $(date +%s) - t0 )) s]"
VERBOSE=1 timeout 120 bash $B/run.sh tests pool_block > $OUT/pool_block.txt 2>&1; echo "rc $?"
grep -E "test .*pool_block|child: |GPU suite|panicked" $OUT/pool_block.txt | grep -v "^ok" | head -30
left=$(( 330 - ($(date +%s) - t0) ))
echo "=== the GPU suite (timeout $left s)  [$(( $(date +%s) - t0 )) s]"
VERBOSE=1 timeout $left bash $B/run.sh tests > $OUT/suite.txt 2>&1; echo "rc $?"
grep -E "^(ok|FAILED)|GPU suite|^---" $OUT/suite.txt | grep -vE "^ok "
echo "[$(( $(date +%s) - t0 )) s]"
