#!/usr/bin/env bash
# Call S (one H200), the final commit: suite; every CuPy client; the PyTorch workload's history
# report; bench_rtc twice (paired ratios); bench_pool.
export NCCL_NVLS_ENABLE=0
B=target/gpu-bundle
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s); END=${END:-585}
step() { echo "=== [$(( $(date +%s) - t0 ))s] $1"; }
tl() { local left=$(( END - ($(date +%s) - t0) )); [ "$left" -lt "$1" ] && echo "$left" || echo "$1"; }
step suite; VERBOSE=1 timeout $(tl 150) bash $B/run.sh tests > $OUT/suite.txt 2>&1; echo "rc=$?"
grep -E "^(ok|FAILED) |GPU suite|two-GPU" $OUT/suite.txt
step rtc; for i in 1 2; do timeout $(tl 80) bash $B/run.sh rtc-bench > $OUT/rtc_bench_$i.txt 2>&1; grep -E "launch issue" $OUT/rtc_bench_$i.txt; done
step bench_pool; timeout $(tl 60) $B/bench/bench_pool > $OUT/bench_pool.txt 2>&1; grep -E "^pool_pair|history" $OUT/bench_pool.txt | cut -c1-150
step torch-history; timeout $(tl 120) python3 $B/history_workload.py --only torch --repeats 1 --steps 60 --out /tmp/hist > $OUT/history_torch.txt 2>&1; echo "rc=$?"; grep -E "PASS|FAIL|ROW|passed" $OUT/history_torch.txt | cut -c1-200; cp /tmp/hist/torch_0/torch.html $OUT/torch_workload.html
step clients-cupy; CLIENT_ARGS="--seconds 10" VERBOSE=1 timeout $(tl 260) bash $B/run.sh clients cupy > $OUT/clients_cupy.txt 2>&1; echo "rc=$?"
grep -E "^(ok|FAILED) |--- |GPU suite|backtraces" $OUT/clients_cupy.txt | cut -c1-220
step end
