#!/usr/bin/env bash
# Call AE (one H200), commit e97085f (the final bundle): suite; pool pairs pinned; every CuPy
# client; every PyTorch client.
export NCCL_NVLS_ENABLE=0
B=target/gpu-bundle
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s); END=${END:-560}
step() { echo "=== [$(( $(date +%s) - t0 ))s] $1"; }
tl() { local left=$(( END - ($(date +%s) - t0) )); [ "$left" -lt "$1" ] && echo "$left" || echo "$1"; }
step suite; VERBOSE=1 timeout $(tl 160) bash $B/run.sh tests > $OUT/suite.txt 2>&1; echo "rc=$?"
grep -E "^(ok|FAILED) |GPU suite|two-GPU" $OUT/suite.txt
step pairs; timeout $(tl 30) bash target/gpu-scripts/pairs2.sh 2 6 bundle=$B/bench/bench_pool > $OUT/pairs.txt 2>&1; python3 target/gpu-scripts/summ.py $OUT/pairs.txt | grep -A1 "^pool_pair_\(1MiB\|512B\|64MiB\)$"
step clients-torch; VERBOSE=1 timeout $(tl 150) bash $B/run.sh clients torch > $OUT/clients_torch.txt 2>&1; echo "rc=$?"
grep -E "^(ok|FAILED) |--- " $OUT/clients_torch.txt | cut -c1-220
step clients-cupy; CLIENT_ARGS="--seconds 6" VERBOSE=1 timeout $(tl 230) bash $B/run.sh clients cupy > $OUT/clients_cupy.txt 2>&1; echo "rc=$?"
grep -E "^(ok|FAILED) |--- " $OUT/clients_cupy.txt | cut -c1-220
step end
