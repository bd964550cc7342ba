#!/usr/bin/env bash
# Round 7, call 2: CuPy 14.2.0's own suite, chunk by chunk, on CuPy's pool and on ours
# (tests/bundle/cupy_suite.sh), with pytest-xdist carried as wheels.
set -u
cd "$(dirname "$0")/../../.."
[ -d target/gpu-bundle ] || tar -xJf target/gpu-bundle.tar.xz -C target
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
python3 -c 'import xdist, pytest; print("xdist", xdist.__version__, "pytest", pytest.__version__)'
export CUPY_SUITE_WORKERS="${CUPY_SUITE_WORKERS:-16}" CUPY_OWN_LOGS=/tmp/cupy_logs
export CUPY_SUITE_TIMEOUT="${CUPY_SUITE_TIMEOUT:-280}"
bash target/gpu-bundle/cupy_suite.sh "$@" 2>&1 | tee $OUT/cupy_suite.txt
tar -cJf $OUT/cupy_logs.tar.xz -C /tmp cupy_logs 2>/dev/null
