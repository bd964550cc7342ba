#!/usr/bin/env bash
# Round 9, call 1 (issue 49): the cudars wheel installed on the GPU machine (its CPU/driver
# test), bench_pool's pair rows through each C entry point beside the pool's own pair, the raw
# driver and the driver calls that bound the fast path from below (3 runs), the GPU suite, and
# the PyTorch client from the installed wheel.
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
tar -xJf target/gpu-bundle.tar.xz -C target
B=target/gpu-bundle
cp tests/bundle/*.py $B/   # the clients as committed (the bundle may predate a script edit)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
W=$(ls $B/wheels/cudars-*.whl)
echo "=== wheel: $(basename $W) $(stat -c %s $W) bytes"
python3 -m pip install --quiet --no-deps --no-index --target /tmp/cudars-site "$W" 2>&1 | tail -2
export PYTHONPATH=/tmp/cudars-site
(cd /tmp && python3 -c "import cudars, sys; print('import cudars from', cudars.__file__)")
(cd /tmp && python3 $OLDPWD/tests/python/wheel_cpu_test.py --expect-driver present) | tail -4
echo "=== bench_pool pair rows, 3 runs  [$(( $(date +%s) - t0 )) s]"
for r in 1 2 3; do
  echo "--- run $r"
  timeout 60 taskset -c 2 $B/bench/bench_pool 2>&1 | grep -E "^(pool_pair_1MiB|pool_pair_external|external_part|capi_|driver_floor|raw_cumemalloc)"
done | tee $OUT/pairs.txt
echo "=== the GPU suite  [$(( $(date +%s) - t0 )) s]"
bash $B/run.sh tests > $OUT/suite.txt 2>&1; grep -E "GPU suite|FAILED|panicked" $OUT/suite.txt | tail -5
echo "=== clients_torch.py from the wheel  [$(( $(date +%s) - t0 )) s]"
left=$(( 590 - ($(date +%s) - t0) ))
CUDARS_FROM_WHEEL=1 timeout $left python3 $B/clients_torch.py > $OUT/clients_torch.txt 2>&1
grep -E "^--- |FAIL|passed, .* failed$" $OUT/clients_torch.txt | tail -20
echo "[$(( $(date +%s) - t0 )) s]"
