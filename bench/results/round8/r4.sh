#!/usr/bin/env bash
# Round 8, call 4 (#49's first step: where the external-stream pair's time goes, before any
# change): bench_pool's pair rows, the external-stream pair and its parts, the C ABI pair.
set -u
cd "$(dirname "$0")/../../.."
tar -xJf target/gpu-bundle.tar.xz -C target
B=target/gpu-bundle
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for r in 1 2 3; do
  echo "=== run $r"
  timeout 45 taskset -c 2 $B/bench/bench_pool 2>&1 | grep -E "^(pool_pair_1MiB|pool_pair_external|external_part|capi_pair|cuMemAllocAsync|raw)" 
done | tee $OUT/breakdown.txt
