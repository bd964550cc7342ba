#!/usr/bin/env bash
# Round 15, call 1 (2 x H200): #55's registered memory and symmetric windows (the new
# gpu_nccl worker with NCCL's REG log, the whole cuda-nccl suite, bench_nccl --registered
# beside torch MemPool registration), then the GPU suite owed since 2b01a63.
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
tar -xJf target/gpu-bundle.tar.xz -C target
B=$PWD/target/gpu-bundle
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
here=$B; eval "$(sed -n '/^export NCCL_NVLS_ENABLE/,/^test_timeout=/p' $B/run.sh)"
export CUDA_RS_BUNDLE_DIR=$B
echo "=== registered worker with NCCL_DEBUG_SUBSYS=REG  [$(( $(date +%s) - t0 )) s]"
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=REG,INIT VERBOSE=1 timeout 150 bash $B/run.sh nccl multi_process_registered > $OUT/registered_reg_log.txt 2>&1; echo "rc $?"
grep -E "REGISTERED_OK|equal|replays|deregistered|panicked|test result|GPU suite" $OUT/registered_reg_log.txt | head -20
grep -iE "regist|window|symm" $OUT/registered_reg_log.txt | grep -v "^    | rank" | sort | uniq -c | sort -rn | head -15
echo "=== bench_nccl --registered  [$(( $(date +%s) - t0 )) s]"
timeout 150 $B/bench/bench_nccl --registered > $OUT/bench_nccl_registered.txt 2>&1; echo "rc $?"
grep -vE "^nccl all_reduce" $OUT/bench_nccl_registered.txt | tail -40
grep -E "^nccl all_reduce" $OUT/bench_nccl_registered.txt | grep -E "vs plain|NO" | head -40
echo "=== run.sh nccl tests  [$(( $(date +%s) - t0 )) s]"
VERBOSE=1 timeout 200 bash $B/run.sh nccl tests > $OUT/nccl_tests.txt 2>&1; echo "rc $?"
grep -E "^(ok|FAILED)|GPU suite|test result|panicked" $OUT/nccl_tests.txt | head -20
left=$(( 585 - ($(date +%s) - t0) ))
echo "=== the GPU suite (timeout $left s)  [$(( $(date +%s) - t0 )) s]"
VERBOSE=1 timeout $left bash $B/run.sh tests > $OUT/suite.txt 2>&1; echo "rc $?"
grep -E "^(ok|FAILED)|GPU suite|^---" $OUT/suite.txt | grep -vE "^ok "
grep -B2 -A25 "panicked" $OUT/suite.txt | grep -v "gpu_stream_event.rs:323\|deliberate panic\|^    |    [0-9]: \|callback\|rust_begin_unwind\|panic_fmt" | head -40
echo "[$(( $(date +%s) - t0 )) s]"
