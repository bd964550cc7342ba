#!/usr/bin/env bash
# Round 10, call 8: gpu_gpt2 after the memory changes, and the 124M f32 step (ours beside
# PyTorch eager and torch.compile, the fastest PyTorch row of call 7), batch 8 x 1024.
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
tar -xJf target/gpu-bundle.tar.xz -C target
B=target/gpu-bundle
cp tests/bundle/*.py $B/; cp examples/gpt2/reference/train_gpt2_ref.py $B/
nvidia-smi --query-gpu=name --format=csv,noheader
here=$B; eval "$(sed -n '/^export NCCL_NVLS_ENABLE/,/^test_timeout=/p' $B/run.sh)"
echo "=== gpu_gpt2"
timeout 200 $B/tests/gpu_gpt2 --test-threads=1 --nocapture 2>&1 | grep -E "max relative|bit for bit|test result|panicked|FAILED" | tail -8
echo "=== ours  [$(( $(date +%s) - t0 )) s]"
timeout 200 $B/examples/gpt2 bench --config 124m --batch 8 --steps 10 2>&1 | tail -1
D=/tmp/g124; timeout 60 $B/examples/gpt2 init --config 124m --batch 8 --steps 20 --out $D | tail -1
for mode in "" "--compile"; do
  timeout 200 python3 $B/train_gpt2_ref.py --weights $D/weights.safetensors --tokens $D/tokens.safetensors --batch 8 --dtype f32 --bench 10 $mode 2>&1 | tail -1 | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print(f\"torch {d['mode']} f32: {d['ms_median']:.2f} ms/step, peak {d['peak_mem_gib']:.2f} GiB\")"
done
timeout 200 $B/examples/gpt2 bench --config 124m --batch 8 --steps 10 2>&1 | tail -1
echo "[$(( $(date +%s) - t0 )) s]"
