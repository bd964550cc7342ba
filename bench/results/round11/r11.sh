#!/usr/bin/env bash
# Round 11, call 11 (two GPUs): GPT-2's data-parallel tests after the review fixes (each
# rank's gradients against one GPU's, the ranks' parameters bit for bit); cuda-fft's tests and
# bench_fft after the cache memo (on GPU 0).
set -u
cd "$(dirname "$0")/../../.."
tar -xJf target/gpu-bundle.tar.xz -C target
B=$PWD/target/gpu-bundle
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
here=$B; eval "$(sed -n '/^export NCCL_NVLS_ENABLE/,/^test_timeout=/p' $B/run.sh)"
export CUDA_RS_BUNDLE_DIR=$B
timeout 200 $B/tests/gpu_gpt2 --ignored --test-threads=1 --nocapture 2>&1 | grep -E "relative|bit for bit|test result|panicked|FAILED" | head -20
timeout 100 $B/tests/gpu_fft --test-threads=1 2>&1 | grep -E "test result|panicked|FAILED" | head
timeout 60 $B/bench/bench_fft 2>&1 | tail -4
