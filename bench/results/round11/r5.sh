#!/usr/bin/env bash
# Round 11, call 5: the whole GPU suite on this commit, then an experiment: the attention's
# products through cuBLAS (Gemm) against cuBLASLt, f32 and bf16, interleaved.
set -u
cd "$(dirname "$0")/../../.."
tar -xJf target/gpu-bundle.tar.xz -C target
B=$PWD/target/gpu-bundle
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 bash $B/run.sh tests 2>&1 | grep -E "^(ok|FAIL|GPU suite)|panicked|failed" | tail -45
for dt in f32 bf16; do
  for lt in 0 1 0 1; do
    echo -n "attention lt=$lt: "; GPT2_ATTENTION_LT=$lt $B/examples/gpt2 bench --config 124m --batch 8 --steps 8 --dtype $dt | tail -1
  done
done
