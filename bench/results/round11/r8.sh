#!/usr/bin/env bash
# Round 11, call 8: the final code's GPT-2 tests and run.sh gpt2-bench bf16 (ours eager and
# replayed beside PyTorch eager, CUDA graph and torch.compile, explicit and SDPA attention).
set -u
cd "$(dirname "$0")/../../.."
tar -xJf target/gpu-bundle.tar.xz -C target
B=$PWD/target/gpu-bundle
nvidia-smi --query-gpu=name --format=csv,noheader
here=$B; eval "$(sed -n '/^export NCCL_NVLS_ENABLE/,/^test_timeout=/p' $B/run.sh)"
export CUDA_RS_BUNDLE_DIR=$B
timeout 200 $B/tests/gpu_gpt2 --test-threads=1 --nocapture 2>&1 | grep -E "relative|bit for bit|test result|panicked|FAILED|error" | head -20
timeout 330 bash $B/run.sh gpt2-bench bf16 2>&1 | grep -vE "^wrote" | python3 -c "
import json, sys
for line in sys.stdin:
    line = line.strip()
    if line.startswith('{'):
        d = json.loads(line)
        print(f\"torch {d['mode']} {d['dtype']} {d['attention']}: {d['ms_median']:.2f} ms/step (min {d['ms_min']:.2f}), peak {d['peak_mem_gib']:.2f} GiB\")
    elif line:
        print(line)
"
