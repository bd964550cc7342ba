#!/usr/bin/env bash
# Round 15, call 5 (4 x H200, lent at the end of the session; 287 s of budget): #55 on four
# GPUs: registered memory, windows and the registered pool over 4 processes; the captured
# collectives on 4 GPUs; every collective over 4 processes started by cuda-nccl's Launcher with
# torchrun's variables; bench_nccl --registered beside PyTorch on 4 GPUs.
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
tar -xJf target/gpu-bundle.tar.xz -C target
B=$PWD/target/gpu-bundle
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c
here=$B; eval "$(sed -n '/^export NCCL_NVLS_ENABLE/,/^test_timeout=/p' $B/run.sh)"
export CUDA_RS_BUNDLE_DIR=$B
echo "=== gpu_nccl: registered, captured, every collective (4 processes)  [$(( $(date +%s) - t0 )) s]"
timeout 110 $B/tests/gpu_nccl multi_process_registered captured_collectives multi_process_every_collective --test-threads=1 --nocapture > $OUT/gpu_nccl_4.txt 2>&1; echo "rc $?"
grep -E "^test |test result|REGISTERED_OK|registered pool|replays|every collective checked|panicked" $OUT/gpu_nccl_4.txt | head -30
echo "=== bench_nccl --registered (4 GPUs)  [$(( $(date +%s) - t0 )) s]"
left=$(( 175 - ($(date +%s) - t0) ))
timeout $left $B/bench/bench_nccl --registered > $OUT/bench_nccl--registered_4.txt 2>&1; echo "rc $?"
grep -A40 "^    size" $OUT/bench_nccl--registered_4.txt | head -34
grep -A8 "launch cost taken away" $OUT/bench_nccl--registered_4.txt
grep -E "NO" $OUT/bench_nccl--registered_4.txt | grep -v "vs plain" | head
echo "[$(( $(date +%s) - t0 )) s]"
