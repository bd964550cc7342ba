#!/usr/bin/env bash
# Round 10, call 5: the first GPT-2 run (tiny config, f32) against the PyTorch reference.
set -u
cd "$(dirname "$0")/../../.."
tar -xJf target/gpu-bundle.tar.xz -C target
B=target/gpu-bundle
cp tests/bundle/*.py $B/; cp examples/gpt2/reference/train_gpt2_ref.py $B/
nvidia-smi --query-gpu=name --format=csv,noheader
names="gpu_gpt2" VERBOSE=1 timeout 300 bash $B/run.sh tests 2>&1 | tail -60
