#!/usr/bin/env bash
# Round 9, call 3 (issue 49, the code with the fused busy path): bench_pool's pair rows (3 runs),
# the GPU suite, the PyTorch client from the wheel, then workload_bench.py --from-wheel: the
# PyTorch and CuPy workloads, ours from the installed wheel against PyTorch's caching allocator
# (default and expandable) and CuPy's pool, runs interleaved, with the allocators' own pairs
# (torch.empty + del on the default stream and on a torch.cuda.Stream; CuPy's module, plain
# CFunctionAllocator and own pool).
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
tar -xJf target/gpu-bundle.tar.xz -C target
B=target/gpu-bundle
cp tests/bundle/*.py $B/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
W=$(ls $B/wheels/cudars-*.whl)
echo "=== wheel: $(basename $W) $(stat -c %s $W) bytes"
python3 -m pip install --quiet --no-deps --no-index --target /tmp/cudars-site "$W" 2>&1 | tail -2
export PYTHONPATH=/tmp/cudars-site
echo "=== bench_pool pair rows, 3 runs  [$(( $(date +%s) - t0 )) s]"
for r in 1 2 3; do
  echo "--- run $r"
  timeout 60 taskset -c 2 $B/bench/bench_pool 2>&1 | grep -E "^(pool_pair_1MiB|pool_pair_external|capi_|driver_floor)"
done | tee $OUT/pairs.txt
echo "=== the GPU suite  [$(( $(date +%s) - t0 )) s]"
bash $B/run.sh tests > $OUT/suite.txt 2>&1; grep -E "GPU suite|FAILED|panicked" $OUT/suite.txt | tail -5
echo "=== clients_torch.py from the wheel  [$(( $(date +%s) - t0 )) s]"
CUDARS_FROM_WHEEL=1 timeout 170 python3 $B/clients_torch.py > $OUT/clients_torch.txt 2>&1
grep -E "^--- |FAIL|passed, .* failed$" $OUT/clients_torch.txt | tail -14
left=$(( 585 - ($(date +%s) - t0) ))
echo "=== workload_bench.py --from-wheel --budget $(( left - 40 ))  [$(( $(date +%s) - t0 )) s]"
BENCH_OUT=$OUT timeout $left python3 $B/workload_bench.py --from-wheel --runs 6 --budget $(( left - 40 )) > $OUT/workloads.txt 2>&1
grep -vE "round [0-9]+ " $OUT/workloads.txt | tail -40
echo "[$(( $(date +%s) - t0 )) s]"
