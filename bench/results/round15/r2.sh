#!/usr/bin/env bash
# Round 15, call 2 (2 x H200): the registered pool and the call lock: the whole cuda-nccl
# suite (NCCL's REG log of the registered worker first), bench_nccl in its three modes
# (plain and --captured against the numbers of round 14, --registered with the captured
# floor), then the client suites owed since bd38995.
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
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=REG VERBOSE=1 timeout 150 bash $B/run.sh nccl multi_process_registered > $OUT/registered_reg_log.txt 2>&1; echo "rc $?"
grep -E "REGISTERED_OK|registered pool|replays|deregistered|panicked|GPU suite" $OUT/registered_reg_log.txt | head -12
grep -B3 -A12 "panicked" $OUT/registered_reg_log.txt | head -40
grep -ciE "NCCL INFO register comm" $OUT/registered_reg_log.txt
echo "=== bench_nccl (plain, --captured, --registered)  [$(( $(date +%s) - t0 )) s]"
for mode in "" --captured --registered; do
  timeout 150 $B/bench/bench_nccl $mode > $OUT/bench_nccl${mode}.txt 2>&1; echo "rc $? $mode"
done
grep -E "NO|latency  " $OUT/bench_nccl.txt | head -20
tail -14 $OUT/bench_nccl--captured.txt
grep -A40 "^    size" $OUT/bench_nccl--registered.txt | head -34
grep -E "captured (registered|window)|NO" $OUT/bench_nccl--registered.txt | head -30
echo "=== run.sh nccl tests  [$(( $(date +%s) - t0 )) s]"
VERBOSE=1 timeout 200 bash $B/run.sh nccl tests > $OUT/nccl_tests.txt 2>&1; echo "rc $?"
grep -E "^(ok|FAILED)|GPU suite|panicked" $OUT/nccl_tests.txt | head -20
left=$(( 580 - ($(date +%s) - t0) ))
echo "=== run.sh clients (timeout $left s)  [$(( $(date +%s) - t0 )) s]"
CLIENT_ARGS="--seconds 10 --streams 2000" timeout $left bash $B/run.sh clients > $OUT/clients.txt 2>&1; echo "rc $?"
grep -E "^(ok|FAILED)|passed|GPU suite" $OUT/clients.txt | tail -12
echo "[$(( $(date +%s) - t0 )) s]"
