#!/usr/bin/env bash
# Call Q (one H200): suite; every CuPy client (plain route first touch, per-thread, history
# with call stacks included); the PyTorch clients.
export NCCL_NVLS_ENABLE=0
B=target/gpu-bundle
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "tools: $(command -v perf valgrind compute-sanitizer | tr '\n' ' ')"
t0=$(date +%s); END=${END:-585}
step() { echo "=== [$(( $(date +%s) - t0 ))s] $1"; }
tl() { local left=$(( END - ($(date +%s) - t0) )); [ "$left" -lt "$1" ] && echo "$left" || echo "$1"; }
step suite; VERBOSE=1 timeout $(tl 150) bash $B/run.sh tests > $OUT/suite.txt 2>&1; echo "rc=$?"
grep -E "^(ok|FAILED) |GPU suite|two-GPU" $OUT/suite.txt | grep -E "FAILED|GPU suite|graph_explicit|stream_event"
step clients-cupy; CLIENT_ARGS="--seconds 20" VERBOSE=1 timeout $(tl 330) bash $B/run.sh clients cupy > $OUT/clients_cupy.txt 2>&1; echo "rc=$?"
grep -E "^(ok|FAILED) |--- |GPU suite|backtraces|first allocations" $OUT/clients_cupy.txt | cut -c1-220
step clients-torch; VERBOSE=1 timeout $(tl 120) bash $B/run.sh clients torch > $OUT/clients_torch.txt 2>&1; echo "rc=$?"
grep -E "^(ok|FAILED) |--- |GPU suite" $OUT/clients_torch.txt | cut -c1-200
step end
