#!/usr/bin/env bash
# Round 7, call 5: the percentile fix (the module reports mem.size at the pool's 512-byte
# rounding) and CuPy's core_tests on both pools. The bundle is the one of call 3/4 (461fe62;
# the pool and C API have only moved code since); the Python module, clients_cupy.py,
# cupy_alloc_bench.py and cupy_suite.sh come from the working tree over the bundle's copies.
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
[ -d target/gpu-bundle ] || tar -xJf target/gpu-bundle.tar.xz -C target
B=target/gpu-bundle
cp cuda-mempool-capi/python/cuda_mempool_cupy.py $B/lib/
cp tests/bundle/cupy_suite.sh tests/bundle/cupy_suite_conftest.py tests/bundle/clients_cupy.py \
   tests/bundle/clients_common.py tests/bundle/cupy_alloc_bench.py $B/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "=== clients_cupy.py --only block_size"
timeout 90 python3 $B/clients_cupy.py --lib $B/lib/libcudars_mempool_capi.so --only block_size 2>&1 | tail -25
echo "=== cupy_alloc_bench.py --pairs-only"
timeout 90 python3 $B/cupy_alloc_bench.py --lib $B/lib/libcudars_mempool_capi.so --pairs-only --iters 20000 --repeats 15 2>&1 | tail -12
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
export CUPY_SUITE_WORKERS=16 CUPY_OWN_LOGS=/tmp/cupy_logs CUPY_SUITE_TEST_TIMEOUT=${CUPY_SUITE_TEST_TIMEOUT:-60}
export CUPY_SUITE_TIMEOUT=${CUPY_SUITE_TIMEOUT:-330}
export CUPY_SUITE_DEADLINE=$(( t0 + ${BUDGET:-585} ))
echo "=== CuPy's suite: statistics_tests/test_order.py, core_tests (-m 'not slow')"
bash $B/cupy_suite.sh statistics_tests/test_order.py core_tests -- -m "not slow" 2>&1 | tee $OUT/cupy_suite.txt
tar -cJf $OUT/cupy_logs.tar.xz -C /tmp cupy_logs 2>/dev/null
