#!/usr/bin/env bash
# Call R (one H200): suite after the review fixes; the history workloads (PyTorch and CuPy
# through the C ABI, recording on and off, alternating); CuPy clients history / plain route
# first touch and out of memory; bench_rtc.
export NCCL_NVLS_ENABLE=0
B=target/gpu-bundle
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s); END=${END:-585}
step() { echo "=== [$(( $(date +%s) - t0 ))s] $1"; }
tl() { local left=$(( END - ($(date +%s) - t0) )); [ "$left" -lt "$1" ] && echo "$left" || echo "$1"; }
step suite; VERBOSE=1 timeout $(tl 150) bash $B/run.sh tests > $OUT/suite.txt 2>&1; echo "rc=$?"
grep -E "^(ok|FAILED) |GPU suite" $OUT/suite.txt | grep -E "FAILED|GPU suite|graph_explicit|stream_event"
step history-workload; timeout $(tl 260) python3 $B/history_workload.py --out $OUT/history --steps 60 --repeats 3 > $OUT/history_workload.txt 2>&1; echo "rc=$?"
grep -E "PASS|FAIL|ROW|INFO|passed|===" $OUT/history_workload.txt | cut -c1-260
ls -la $OUT/history/torch_0 2>/dev/null | head
step clients; CLIENT_ARGS="--only history" VERBOSE=1 timeout $(tl 60) bash $B/run.sh clients cupy > $OUT/clients_history.txt 2>&1; grep -E "^(ok|FAILED) |--- |backtraces" $OUT/clients_history.txt | cut -c1-200
for s in plain_first_touch plain_oom; do CLIENT_ARGS="--only $s" VERBOSE=1 timeout $(tl 60) bash $B/run.sh clients cupy > $OUT/clients_$s.txt 2>&1; grep -E "^(ok|FAILED) |--- " $OUT/clients_$s.txt | cut -c1-200; done
step rtc; timeout $(tl 90) bash $B/run.sh rtc-bench > $OUT/rtc_bench.txt 2>&1; grep -E "launch issue" $OUT/rtc_bench.txt
step end
