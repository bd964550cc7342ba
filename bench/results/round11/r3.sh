#!/usr/bin/env bash
# Round 11, call 3: the GPT-2 tests after the attention-layout / softmax / cross-entropy /
# GELU-recompute changes, ours bf16 beside PyTorch's fastest rows, and the ncu split again.
set -u
cd "$(dirname "$0")/../../.."
tar -xJf target/gpu-bundle.tar.xz -C target
B=$PWD/target/gpu-bundle
nvidia-smi --query-gpu=name --format=csv,noheader
here=$B; eval "$(sed -n '/^export NCCL_NVLS_ENABLE/,/^test_timeout=/p' $B/run.sh)"
export CUDA_RS_BUNDLE_DIR=$B
timeout 200 $B/tests/gpu_gpt2 --test-threads=1 --nocapture 2>&1 | grep -E "relative|bit for bit|test result|panicked|FAILED|error" | head -20
d=/tmp/g2; $B/examples/gpt2 init --config 124m --batch 8 --steps 20 --out $d > /dev/null
torchrow() { python3 -c "
import json, sys
for line in sys.stdin:
    line = line.strip()
    if line.startswith('{'):
        d = json.loads(line)
        print(f\"torch {d['mode']} {d['dtype']} {d['attention']}: {d['ms_median']:.2f} ms/step, peak {d['peak_mem_gib']:.2f} GiB\")
"; }
$B/examples/gpt2 bench --config 124m --batch 8 --steps 10 --dtype bf16 | tail -1
for m in "" --compile; do
  python3 $B/train_gpt2_ref.py --weights $d/weights.safetensors --tokens $d/tokens.safetensors --batch 8 --dtype bf16 --bench 10 --sdpa $m 2>/dev/null | torchrow
done
$B/examples/gpt2 bench --config 124m --batch 8 --steps 10 --dtype bf16 | tail -1
timeout 200 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
  --launch-count 3000 $B/examples/gpt2 bench --config 124m --batch 8 --steps 1 --dtype bf16 > /tmp/ncu.csv 2>/dev/null
python3 bench/results/round11/split.py /tmp/ncu.csv bf16
