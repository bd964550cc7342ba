#!/usr/bin/env bash
# Call W (one H200): bisect the pool pair's regression: bench_pool of 18 commits from 1b3b12a
# (presplit) to HEAD, pinned to one core, 3 rounds interleaved.
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
lscpu | grep -E "Model name|MHz" | head -3
tar -xJf target/bisb.tar.xz -C target
B=target/bisb
args=""
for c in 1b3b12a 03b6958 72f0264 efbb41d c587022 d04664c e0e1ffe fa79329 1b79e52 e09246d dbd2d54 65a0d9d 411796b f110b29 76e2401 3329b07 5032b12 1243ff2; do args="$args $c=$B/bench_pool_$c"; done
t0=$(date +%s)
bash target/gpu-scripts/pairs2.sh 3 6 $args > $OUT/pairs.txt 2>&1
echo "pairs took $(( $(date +%s) - t0 ))s"
python3 target/gpu-scripts/summ.py $OUT/pairs.txt
