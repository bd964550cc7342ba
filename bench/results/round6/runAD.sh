#!/usr/bin/env bash
# Call AD (one H200), commit a097aa1 (history call stacks in optimised builds): suite; pool
# pairs pinned against 1243ff2; the CuPy history client (call stacks through the C ABI); the
# PyTorch/CuPy history workload once.
export NCCL_NVLS_ENABLE=0
B=target/gpu-bundle
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s); END=${END:-400}
step() { echo "=== [$(( $(date +%s) - t0 ))s] $1"; }
tl() { local left=$(( END - ($(date +%s) - t0) )); [ "$left" -lt "$1" ] && echo "$left" || echo "$1"; }
tar -xJf target/bisd.tar.xz -C target
step suite; VERBOSE=1 timeout $(tl 160) bash $B/run.sh tests > $OUT/suite.txt 2>&1; echo "rc=$?"
grep -E "^(ok|FAILED) |GPU suite|two-GPU" $OUT/suite.txt
step pairs; timeout $(tl 60) bash target/gpu-scripts/pairs2.sh 3 6 before=target/bisd/bench_pool_1243ff2 after=$B/bench/bench_pool > $OUT/pairs.txt 2>&1; python3 target/gpu-scripts/summ.py $OUT/pairs.txt
step history-client; CLIENT_ARGS="--only history --seconds 8" VERBOSE=1 timeout $(tl 90) bash $B/run.sh clients cupy > $OUT/clients_history.txt 2>&1; echo "rc=$?"
grep -E "^(ok|FAILED) |--- |stack|site" $OUT/clients_history.txt | cut -c1-220 | head -20
step history-workload; timeout $(tl 120) python3 $B/history_workload.py --only torch --repeats 1 --steps 30 --out /tmp/hist > $OUT/history_torch.txt 2>&1; echo "rc=$?"; grep -E "PASS|FAIL|passed" $OUT/history_torch.txt | cut -c1-200 | head -12
python3 - <<'PY' 2>/dev/null | head -5
import glob,re
for f in glob.glob('/tmp/hist/torch_0/*.html')[:1]:
    t=open(f).read()
    sites=re.findall(r'([A-Za-z_][\w:<>.]*) \(([^()]*\.py):(\d+)\)', t)
    print("report call sites (first 5):", sites[:5])
PY
step end
