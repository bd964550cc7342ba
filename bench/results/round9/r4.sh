#!/usr/bin/env bash
# Round 9, call 4 (issue 49): the CuPy part of workload_bench.py --from-wheel (call 3's CuPy runs
# failed on a test-script bug: the wheel's package folder on sys.path shadowed `cupy`): the
# allocation pair through the CuPy module's path, the plain CFunctionAllocator route and CuPy's
# own pool in one process, and the CuPy workload's step times, ours from the installed wheel
# against CuPy's pool, runs interleaved.
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
tar -xJf target/gpu-bundle.tar.xz -C target
B=target/gpu-bundle
cp tests/bundle/*.py $B/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
W=$(ls $B/wheels/cudars-*.whl)
python3 -m pip install --quiet --no-deps --no-index --target /tmp/cudars-site "$W" 2>&1 | tail -2
export PYTHONPATH=/tmp/cudars-site
BENCH_OUT=$OUT timeout 560 python3 $B/workload_bench.py --from-wheel --only cupy --runs 8 --budget 420 > $OUT/workloads_cupy.txt 2>&1
grep -vE "round [0-9]+ " $OUT/workloads_cupy.txt | tail -30
echo "[$(( $(date +%s) - t0 )) s]"
