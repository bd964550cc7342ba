#!/usr/bin/env bash
# Round 11, call 6 (two GPUs): the two-GPU tests, GPT-2's data parallel among them (one
# process per GPU through cuda-nccl's rendezvous, and the single-process form).
set -u
cd "$(dirname "$0")/../../.."
tar -xJf target/gpu-bundle.tar.xz -C target
B=$PWD/target/gpu-bundle
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 bash $B/run.sh two-gpu 2>&1 | tail -30
here=$B; eval "$(sed -n '/^export NCCL_NVLS_ENABLE/,/^test_timeout=/p' $B/run.sh)"
export CUDA_RS_BUNDLE_DIR=$B
timeout 200 $B/tests/gpu_gpt2 --ignored --test-threads=1 --nocapture 2>&1 | grep -E "relative|losses|test result|panicked|FAILED" | head -20
