#!/usr/bin/env bash
# Round 11, call 9: cuda-fft's GPU tests, memcheck on them, run.sh fft-bench; the GPT-2
# tests after the review fixes.
set -u
cd "$(dirname "$0")/../../.."
tar -xJf target/gpu-bundle.tar.xz -C target
B=$PWD/target/gpu-bundle
nvidia-smi --query-gpu=name --format=csv,noheader
here=$B; eval "$(sed -n '/^export NCCL_NVLS_ENABLE/,/^test_timeout=/p' $B/run.sh)"
export CUDA_RS_BUNDLE_DIR=$B
timeout 120 $B/tests/gpu_fft --test-threads=1 --nocapture 2>&1 | grep -vE "^$" | tail -40
echo "=== memcheck gpu_fft"
timeout 200 compute-sanitizer --tool memcheck --report-api-errors no $B/tests/gpu_fft --test-threads=1 2>&1 | grep -E "test result|ERROR SUMMARY|panicked" | tail -5
timeout 120 bash $B/run.sh fft-bench 2>&1 | tail -12
timeout 200 $B/tests/gpu_gpt2 --test-threads=1 --nocapture 2>&1 | grep -E "relative|bit for bit|test result|panicked|FAILED|error" | head -20
