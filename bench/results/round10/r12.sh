#!/usr/bin/env bash
# Round 10, call 12: gpt2 train with the progress line and the memory report (tiny config).
set -u
cd "$(dirname "$0")/../../.."
tar -xJf target/gpu-bundle.tar.xz -C target
B=target/gpu-bundle
here=$B; eval "$(sed -n '/^export NCCL_NVLS_ENABLE/,/^test_timeout=/p' $B/run.sh)"
$B/examples/gpt2 init --config tiny --batch 4 --steps 5 --out /tmp/gt
$B/examples/gpt2 train --weights /tmp/gt/weights.safetensors --tokens /tmp/gt/tokens.safetensors --steps 5 --batch 4 --memory-report $OUT/gpt2_memory.html
ls -la $OUT/gpt2_memory.html; grep -c "<svg\|<rect" $OUT/gpt2_memory.html
