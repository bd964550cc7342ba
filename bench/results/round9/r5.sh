#!/usr/bin/env bash
# Round 9, call 5 (issue 49): CuPy 14.2's own test files (graph, stream, DLPack) on CuPy's pool,
# on ours and through the plain route, ours from the installed cudars wheel.
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
tar -xJf target/gpu-bundle.tar.xz -C target
B=target/gpu-bundle
cp tests/bundle/*.py tests/bundle/*.sh $B/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
W=$(ls $B/wheels/cudars-*.whl)
python3 -m pip install --quiet --no-deps --no-index --target /tmp/cudars-site "$W" 2>&1 | tail -2
export PYTHONPATH=/tmp/cudars-site
CUDARS_FROM_WHEEL=1 CUPY_OWN_LOGS=$OUT/cupy_own timeout 570 bash $B/cupy_own_tests.sh 2>&1 | tee $OUT/cupy_own_tests.txt | tail -20
echo "[$(( $(date +%s) - t0 )) s]"
