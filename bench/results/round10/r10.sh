#!/usr/bin/env bash
# Round 10, call 10 (two GPUs): the two-GPU tests, the GPT-2 data-parallel one among them.
set -u
cd "$(dirname "$0")/../../.."
tar -xJf target/gpu-bundle.tar.xz -C target
B=target/gpu-bundle
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 400 bash $B/run.sh two-gpu > $OUT/two_gpu.txt 2>&1; grep -vE "^    \| " $OUT/two_gpu.txt | grep -vE "^ok .* 0 passed" | tail -12
here=$B; eval "$(sed -n '/^export NCCL_NVLS_ENABLE/,/^test_timeout=/p' $B/run.sh)"
timeout 200 $B/tests/gpu_gpt2 data_parallel --ignored --test-threads=1 --nocapture 2>&1 | grep -E "data parallel|losses|test result" | tail -5
