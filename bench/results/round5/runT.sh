#!/usr/bin/env bash
# Call T (one H200): bench_rtc's launch rows and their parts, unpinned and pinned to one core.
export NCCL_NVLS_ENABLE=0
B=target/gpu-bundle
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for i in 1 2; do echo "=== unpinned $i"; timeout 100 bash $B/run.sh rtc-bench > $OUT/rtc_$i.txt 2>&1; grep -E "launch" $OUT/rtc_$i.txt; done
for i in 1 2; do echo "=== pinned (taskset -c 2) $i"; timeout 100 taskset -c 2 bash $B/run.sh rtc-bench > $OUT/rtc_pinned_$i.txt 2>&1; grep -E "launch" $OUT/rtc_pinned_$i.txt; done
