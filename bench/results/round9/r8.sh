#!/usr/bin/env bash
# Round 9, call 8 (the final code after the re-read: the C memo refactor, unsafe end hook): the
# GPU suite, one bench_pool run's C ABI rows, and the PyTorch client from the installed wheel.
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
echo "=== the GPU suite"
timeout 150 bash $B/run.sh tests > $OUT/suite.txt 2>&1; grep -E "GPU suite|FAILED|panicked" $OUT/suite.txt | tail -5
echo "=== bench_pool, one run  [$(( $(date +%s) - t0 )) s]"
timeout 40 taskset -c 2 $B/bench/bench_pool 2>&1 | grep -E "^(pool_pair_1MiB|capi_torch|capi_plain|driver_floor)" | tee $OUT/pairs.txt
echo "=== clients_torch.py from the wheel  [$(( $(date +%s) - t0 )) s]"
CUDARS_FROM_WHEEL=1 timeout 180 python3 $B/clients_torch.py > $OUT/clients_torch.txt 2>&1
grep -E "^--- |passed, .* failed$" $OUT/clients_torch.txt | tail -12
echo "[$(( $(date +%s) - t0 )) s]"
