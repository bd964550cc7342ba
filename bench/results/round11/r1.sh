#!/usr/bin/env bash
# Round 11, call 1: the GPT-2 tests (f32, bf16 against PyTorch autocast, graph and loader bit
# for bit), then the bf16 benchmark rows (ours beside PyTorch's).
set -u
cd "$(dirname "$0")/../../.."
tar -xJf target/gpu-bundle.tar.xz -C target
B=$PWD/target/gpu-bundle
nvidia-smi --query-gpu=name --format=csv,noheader
here=$B; eval "$(sed -n '/^export NCCL_NVLS_ENABLE/,/^test_timeout=/p' $B/run.sh)"
export CUDA_RS_BUNDLE_DIR=$B
timeout 200 $B/tests/gpu_gpt2 --test-threads=1 --nocapture 2>&1 | grep -vE "^wrote" | tail -40
timeout 330 bash $B/run.sh gpt2-bench bf16 2>&1 | grep -vE "^wrote" | python3 -c "
import json, sys
for line in sys.stdin:
    line = line.strip()
    if line.startswith('{'):
        d = json.loads(line)
        print(f\"torch {d['mode']} {d['dtype']} {d['attention']}: {d['ms_median']:.2f} ms/step, peak {d['peak_mem_gib']:.2f} GiB\")
    elif line:
        print(line)
"
