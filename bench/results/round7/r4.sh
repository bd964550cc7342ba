#!/usr/bin/env bash
# Round 7, call 4: CuPy's own suite (r2.sh) on the chunks given, with a per-test timeout and
# `-m "not slow"`, the script from the working tree over the bundle's copy, until the deadline.
set -u
cd "$(dirname "$0")/../../.."
[ -d target/gpu-bundle ] || tar -xJf target/gpu-bundle.tar.xz -C target
cp tests/bundle/cupy_suite.sh target/gpu-bundle/cupy_suite.sh
export CUPY_SUITE_DEADLINE=$(( $(date +%s) + ${BUDGET:-540} ))
export CUPY_SUITE_TEST_TIMEOUT=${CUPY_SUITE_TEST_TIMEOUT:-20} CUPY_SUITE_TIMEOUT=${CUPY_SUITE_TIMEOUT:-150}
bash bench/results/round7/r2.sh "$@" -- -m "not slow"
