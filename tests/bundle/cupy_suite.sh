#!/usr/bin/env bash
# CuPy 14.2.0's own test suite, chunk by chunk (tests/cupy_tests/<chunk> of the cupy/cupy
# v14.2.0 tag, with its tests/conftest.py and LICENSE, bundled as cupy_tests_v14.2.0.tar.xz),
# each chunk run on CuPy's own memory pool and then with cuda_mempool_cupy.install() active
# (the plugin cupy_suite_conftest.py, loaded with -p). For each chunk it prints both runs'
# pytest summaries, the tests failing only on ours (passing on CuPy's pool), and ends with
# "N passed, N failed", where a failure is a test that fails with cuda-mempool and passes with
# CuPy's pool, or a run that did not complete.
#
# Usage: bash cupy_suite.sh [chunk ...] [-- extra pytest args, e.g. -m "not slow"]
#   chunks default to: cuda_tests core_tests creation_tests manipulation_tests sorting_tests
#   indexing_tests math_tests statistics_tests (a chunk may name a file or folder under
#   cupy_tests, e.g. core_tests/fusion_tests)
# Environment: CUPY_SUITE_WORKERS=N runs pytest-xdist with N workers when it can be imported;
#   CUPY_SUITE_TEST_TIMEOUT=S bounds each test (pytest-timeout, when it can be imported);
#   CUPY_SUITE_TIMEOUT=S bounds each run (default 1500 s); CUPY_SUITE_DEADLINE=EPOCH starts no
#   run that would end after it (those print "not run"); CUPY_SUITE_MODES (default
#   "cupy ours"); CUPY_OWN_LOGS=DIR keeps each run's whole output there.
# Needs python3 with CuPy 14.x and pytest; lib/ beside this script.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
lib="$here/lib/libcudars_mempool_capi.so"
chunks=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do chunks+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#chunks[@]} -gt 0 ] || chunks=(cuda_tests core_tests creation_tests manipulation_tests
  sorting_tests indexing_tests math_tests statistics_tests)
if ! python3 -c 'import pytest, cupy' 2>/dev/null; then
  echo "FAIL: python3 cannot import pytest and cupy"; echo "0 passed, 1 failed"; exit 1
fi
[ -f "$lib" ] || { echo "FAIL: $lib not found"; echo "0 passed, 1 failed"; exit 1; }
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
tar -xJf "$here/cupy_tests_v14.2.0.tar.xz" -C "$work"
mkdir -p "$work/plugin"
cp "$here/cupy_suite_conftest.py" "$work/plugin/cudars_cupy_suite.py"
xdist=()
if [ -n "${CUPY_SUITE_WORKERS:-}" ] && python3 -c 'import xdist' 2>/dev/null; then
  xdist=(-n "$CUPY_SUITE_WORKERS" -p no:benchmark)
fi
# CUPY_SUITE_TEST_TIMEOUT=S fails any single test that runs longer (pytest-timeout), so a
# hanging or very slow test costs S seconds in both runs instead of the whole chunk.
if [ -n "${CUPY_SUITE_TEST_TIMEOUT:-}" ] && python3 -c 'import pytest_timeout' 2>/dev/null; then
  xdist+=(--timeout "$CUPY_SUITE_TEST_TIMEOUT")
fi
echo "CuPy $(python3 -c 'import cupy; print(cupy.__version__)'), pytest $(python3 -c 'import pytest; print(pytest.__version__)'), workers: ${CUPY_SUITE_WORKERS:-1}${xdist[*]:+ (xdist)}"
passed=0; failed=0; not_run=0
for chunk in "${chunks[@]}"; do
  for mode in ${CUPY_SUITE_MODES:-cupy ours}; do
    start=$(date +%s)
    limit="${CUPY_SUITE_TIMEOUT:-1500}"
    if [ -n "${CUPY_SUITE_DEADLINE:-}" ]; then
      left=$(( CUPY_SUITE_DEADLINE - start ))
      if [ "$left" -lt 30 ] || { [ "$mode" = cupy ] && [ "$left" -lt 60 ]; }; then
        echo "cupy-suite $chunk on $mode: not run (out of time)"; not_run=$((not_run + 1))
        [ "$mode" = cupy ] && break
        continue
      fi
      [ "$left" -lt "$limit" ] && limit=$left
    fi
    out="$(cd "$work/tests" && CUDA_MEMPOOL_CUPY_SUITE=$mode CUDA_MEMPOOL_CAPI_LIB="$lib" \
      PYTHONPATH="$work/plugin:$here/lib${PYTHONPATH:+:$PYTHONPATH}" \
      timeout "$limit" python3 -m pytest -q -rfE -p no:cacheprovider \
      -p cudars_cupy_suite "${xdist[@]}" "cupy_tests/$chunk" "$@" 2>&1)"; rc=$?
    tag="${chunk//\//_}.$mode"
    printf '%s\n' "$out" > "$work/$tag.log"
    [ -n "${CUPY_OWN_LOGS:-}" ] && mkdir -p "$CUPY_OWN_LOGS" && cp "$work/$tag.log" "$CUPY_OWN_LOGS/"
    summary="$(printf '%s\n' "$out" | grep -E '^=+ .*(passed|failed|error).* in ' | tail -n1)"
    [ -n "$summary" ] || summary="$(printf '%s\n' "$out" | grep -E '(passed|failed|error).* in [0-9.]+s' | tail -n1)"
    printf '%s\n' "$out" | sed -nE 's/^(FAILED|ERROR) ([^ ]+).*/\2/p' | sort -u > "$work/$tag.failed"
    echo "cupy-suite $chunk on $mode: ${summary:-no pytest summary (exit $rc)} ($(( $(date +%s) - start )) s)"
    if [ "$mode" = cupy ]; then
      base_complete=1
      if [ -z "$summary" ]; then
        base_complete=0; failed=$((failed + 1)); printf '%s\n' "$out" | tail -n 20 | sed 's/^/    | /'
      fi
      continue
    fi
    base="$work/${chunk//\//_}.cupy.failed"
    [ -f "$base" ] || : > "$base"
    only="$(comm -13 "$base" "$work/$tag.failed")"
    n_only=$(printf '%s' "$only" | grep -c . || true)
    n_both=$(comm -12 "$base" "$work/$tag.failed" | grep -c . || true)
    p=$(printf '%s\n' "$summary" | sed -nE 's/^(.*[^0-9])?([0-9]+) passed.*/\2/p'); p=${p:-0}
    if [ "${base_complete:-1}" = 0 ]; then
      # CuPy's run did not finish: its failures are unknown, so nothing can be called
      # "only on ours"; the chunk already counts as a failure.
      echo "    $chunk on $mode: $p passed; no comparison (CuPy's run did not complete)"
      passed=$((passed + p)); continue
    fi
    echo "    $chunk on $mode: $p passed; $n_only failing only on $mode (pass on CuPy's pool); $n_both failing on both"
    if [ -n "$only" ]; then
      printf '%s\n' "$only" | head -n 40 | sed 's/^/    only on '"$mode"': /'
      printf '%s\n' "$out" | grep -E '^(E |FAILED|ERROR)' | head -n 60 | sed 's/^/    | /'
    fi
    if [ -z "$summary" ]; then
      n_only=$((n_only + 1)); printf '%s\n' "$out" | tail -n 20 | sed 's/^/    | /'
    fi
    passed=$((passed + p)); failed=$((failed + n_only))
  done
done
[ "$not_run" -gt 0 ] && echo "($not_run runs not made: out of time)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
