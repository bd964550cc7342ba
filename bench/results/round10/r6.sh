#!/usr/bin/env bash
# Round 10, call 6: gpu_gpt2 (f32 against PyTorch; the replayed step bit for bit), then the
# 124M f32 step beside PyTorch f32 (eager, CUDA graph, torch.compile) at batch 8 x 1024.
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
tar -xJf target/gpu-bundle.tar.xz -C target
B=target/gpu-bundle
cp tests/bundle/*.py $B/; cp examples/gpt2/reference/train_gpt2_ref.py $B/
nvidia-smi --query-gpu=name --format=csv,noheader
here=$B; eval "$(sed -n '/^export NCCL_NVLS_ENABLE/,/^test_timeout=/p' $B/run.sh)"
echo "=== gpu_gpt2"
timeout 200 $B/tests/gpu_gpt2 --test-threads=1 --nocapture 2>&1 | grep -vE "^step [1-8]:" | tail -25
echo "=== ours: gpt2 bench 124M f32 batch 8  [$(( $(date +%s) - t0 )) s]"
timeout 150 $B/examples/gpt2 bench --config 124m --batch 8 --steps 10 2>&1 | tail -4
echo "=== PyTorch f32 batch 8  [$(( $(date +%s) - t0 )) s]"
D=/tmp/g124; timeout 60 $B/examples/gpt2 init --config 124m --batch 8 --steps 20 --out $D | tail -1
for mode in "" "--cuda-graph" "--compile"; do
  timeout 200 python3 $B/train_gpt2_ref.py --weights $D/weights.safetensors --tokens $D/tokens.safetensors --batch 8 --dtype f32 --bench 10 $mode 2>&1 | tail -1
done
echo "[$(( $(date +%s) - t0 )) s]"
