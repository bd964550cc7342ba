#!/usr/bin/env bash
# Round 12, call 7 (two GPUs): #55's captured collectives (all-reduce, all-gather, reduce-
# scatter, broadcast captured per rank, 1,000 replays with new inputs, the pool flat, a
# replay after the communicator is dropped), then the whole NCCL suite (run.sh nccl tests)
# and the one-GPU suite after the communicator keep-alive change.
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
tar -xJf target/gpu-bundle.tar.xz -C target
B=$PWD/target/gpu-bundle
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
here=$B; eval "$(sed -n '/^export NCCL_NVLS_ENABLE/,/^test_timeout=/p' $B/run.sh)"
export CUDA_RS_BUNDLE_DIR=$B
echo "=== captured collectives"
timeout 200 $B/tests/gpu_nccl captured --test-threads=1 --nocapture 2>&1 | grep -E "rank [0-9]|test result|panicked|FAILED|Error" | head -12
echo "=== run.sh nccl tests  [$(( $(date +%s) - t0 )) s]"
timeout 300 bash $B/run.sh nccl tests > $OUT/nccl.txt 2>&1; grep -E "^(ok|FAILED)|GPU suite|passed" $OUT/nccl.txt | tail -5
grep -B2 -A20 "panicked" $OUT/nccl.txt | head -40
echo "=== the GPU suite  [$(( $(date +%s) - t0 )) s]"
timeout 300 bash $B/run.sh tests > $OUT/suite.txt 2>&1; grep -E "^FAILED|GPU suite" $OUT/suite.txt
echo "[$(( $(date +%s) - t0 )) s]"
