#!/usr/bin/env bash
# Round 10, call 4 (two GPUs): the two-GPU tests, the new ones of gpu_blas and gpu_rand among
# them (an operand or a stream of the other device refused before anything runs).
set -u
cd "$(dirname "$0")/../../.."
tar -xJf target/gpu-bundle.tar.xz -C target
B=target/gpu-bundle
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 400 bash $B/run.sh two-gpu 2>&1 | tee $OUT/two_gpu.txt | grep -vE "^    \| " | tail -40
