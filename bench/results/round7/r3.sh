#!/usr/bin/env bash
# Round 7, call 3: the new code's suite, round-3 tests and memcheck (r1.sh, new side only),
# then CuPy's own suite (r2.sh) on the chunks given, until 9 minutes from the start.
set -u
cd "$(dirname "$0")/../../.."
export CUPY_SUITE_DEADLINE=$(( $(date +%s) + ${BUDGET:-540} ))
[ -n "${SKIP_R1:-}" ] || SIDES=new bash bench/results/round7/r1.sh 2>&1 | tee $OUT/r1.txt | tail -n 60
CUPY_SUITE_TIMEOUT=${CUPY_SUITE_TIMEOUT:-240} bash bench/results/round7/r2.sh "$@"
