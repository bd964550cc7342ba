#!/usr/bin/env bash
# Round 11, call 2: where a step's time goes (ncu: each kernel's duration, clocks and caches
# left alone), bf16 and f32, 124M, batch 8 x 1024.
set -u
cd "$(dirname "$0")/../../.."
tar -xJf target/gpu-bundle.tar.xz -C target
B=$PWD/target/gpu-bundle
nvidia-smi --query-gpu=name --format=csv,noheader
here=$B; eval "$(sed -n '/^export NCCL_NVLS_ENABLE/,/^test_timeout=/p' $B/run.sh)"
export CUDA_RS_BUNDLE_DIR=$B
for dt in bf16 f32; do
  timeout 240 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
    --launch-count 3000 $B/examples/gpt2 bench --config 124m --batch 8 --steps 1 --dtype $dt > /tmp/ncu_$dt.csv 2>/tmp/ncu_$dt.err
  echo "ncu rc $? ($(wc -l < /tmp/ncu_$dt.csv) lines)"; tail -3 /tmp/ncu_$dt.err
  python3 bench/results/round11/split.py /tmp/ncu_$dt.csv "$dt"
done
