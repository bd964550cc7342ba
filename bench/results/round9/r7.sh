#!/usr/bin/env bash
# Round 9, call 7 (issue 49, the final code, after the second review): the GPU suite,
# bench_pool's pair rows (3 runs), and the PyTorch and CuPy clients from the installed wheel.
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
(cd /tmp && python3 $OLDPWD/tests/python/wheel_cpu_test.py --expect-driver present) > $OUT/wheel_test.txt 2>&1; tail -1 $OUT/wheel_test.txt
echo "=== the GPU suite  [$(( $(date +%s) - t0 )) s]"
bash $B/run.sh tests > $OUT/suite.txt 2>&1; grep -E "GPU suite|FAILED|panicked" $OUT/suite.txt | tail -5
echo "=== bench_pool pair rows, 3 runs  [$(( $(date +%s) - t0 )) s]"
for r in 1 2 3; do
  echo "--- run $r"
  timeout 60 taskset -c 2 $B/bench/bench_pool 2>&1 | grep -E "^(pool_pair_1MiB|pool_pair_external|capi_|driver_floor)"
done > $OUT/pairs.txt; grep -E "^(---|pool_pair_1MiB|capi_torch_pair_announced|capi_plain)" $OUT/pairs.txt
echo "=== clients_torch.py from the wheel  [$(( $(date +%s) - t0 )) s]"
CUDARS_FROM_WHEEL=1 timeout 170 python3 $B/clients_torch.py > $OUT/clients_torch.txt 2>&1
grep -E "^--- |passed, .* failed$" $OUT/clients_torch.txt | tail -12
left=$(( 590 - ($(date +%s) - t0) ))
echo "=== clients_cupy.py --seconds 4 from the wheel  [$(( $(date +%s) - t0 )) s]"
CUDARS_FROM_WHEEL=1 timeout $left python3 $B/clients_cupy.py --seconds 4 > $OUT/clients_cupy.txt 2>&1
grep -E "FAIL|passed, .* failed$" $OUT/clients_cupy.txt | tail -8
echo "[$(( $(date +%s) - t0 )) s]"
