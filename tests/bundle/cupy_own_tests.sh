#!/usr/bin/env bash
# CuPy's own tests of streams, graph capture and DLPack (tests/cupy_tests/cuda_tests/test_graph.py,
# test_stream.py and core_tests/test_dlpack.py of cupy/cupy v14.2.0, bundled as
# cupy_suite_test_*.py), run with pytest on CuPy's own memory pool, then with
# cuda_mempool_cupy.install() active, then through the plain route (CFunctionAllocator over
# cuda_mempool_cupy_malloc). Prints each run's pass/fail counts, the tests that fail on ours
# but pass on CuPy's pool, and ends with "N passed, N failed" (a failure: a test that fails
# with cuda-mempool and passes with CuPy's pool, or a run that did not complete).
#
# Usage: bash cupy_own_tests.sh [extra pytest args, e.g. -k graph]
# Needs python3 with CuPy 14.x and pytest; lib/ beside this script (or, with
# CUDARS_FROM_WHEEL=1, the cudars wheel importable).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
lib="$here/lib/libcudars_mempool_capi.so"
libpath="$here/lib"
# CUDARS_FROM_WHEEL=1: ours and plain from the installed cudars wheel (its library, and
# cudars.cupy.install() for ours), nothing from lib/.
if [ "${CUDARS_FROM_WHEEL:-}" = 1 ]; then
  lib="$(python3 -c 'import cudars; print(cudars.library_path())')" || { echo "FAIL: no cudars wheel importable"; echo "0 passed, 1 failed"; exit 1; }
  libpath=""
  echo "from the installed wheel: $lib"
fi
if ! python3 -c 'import pytest, cupy' 2>/dev/null; then
  echo "FAIL: python3 cannot import pytest and cupy"; echo "0 passed, 1 failed"; exit 1
fi
[ -f "$lib" ] || { echo "FAIL: $lib not found"; echo "0 passed, 1 failed"; exit 1; }
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
mkdir -p "$work/suite/cuda_tests" "$work/suite/core_tests"
cp "$here/cupy_suite_conftest.py" "$work/suite/conftest.py"
cp "$here/cupy_suite_test_graph.py" "$work/suite/cuda_tests/test_graph.py"
cp "$here/cupy_suite_test_stream.py" "$work/suite/cuda_tests/test_stream.py"
cp "$here/cupy_suite_test_dlpack.py" "$work/suite/core_tests/test_dlpack.py"
echo "CuPy $(python3 -c 'import cupy; print(cupy.__version__)'), pytest $(python3 -c 'import pytest; print(pytest.__version__)')"
passed=0; failed=0
for mode in cupy ours plain; do
  start=$(date +%s)
  out="$(cd "$work" && CUDA_MEMPOOL_CUPY_SUITE=$mode CUDA_MEMPOOL_CAPI_LIB="$lib" \
    PYTHONPATH="${libpath}${libpath:+${PYTHONPATH:+:}}${PYTHONPATH:-}" timeout 1500 \
    python3 -m pytest -q -rfE -p no:cacheprovider --import-mode=importlib suite "$@" 2>&1)"; rc=$?
  printf '%s\n' "$out" > "$work/$mode.log"
  # CUPY_OWN_LOGS=DIR keeps each mode's whole pytest output there.
  [ -n "${CUPY_OWN_LOGS:-}" ] && mkdir -p "$CUPY_OWN_LOGS" && cp "$work/$mode.log" "$CUPY_OWN_LOGS/"
  summary="$(printf '%s\n' "$out" | grep -E '^=+ .*(passed|failed|error).* in ' | tail -n1)"
  [ -n "$summary" ] || summary="$(printf '%s\n' "$out" | grep -E '(passed|failed|error).* in [0-9.]+s' | tail -n1)"
  printf '%s\n' "$out" | sed -nE 's/^(FAILED|ERROR) ([^ ]+).*/\2/p' | sort -u > "$work/$mode.failed"
  echo "cupy-own-tests on $mode: ${summary:-no pytest summary (exit $rc)} ($(( $(date +%s) - start )) s)"
  if [ "$mode" = cupy ]; then
    if [ -z "$summary" ]; then failed=$((failed + 1)); printf '%s\n' "$out" | tail -n 40 | sed 's/^/    | /'; fi
    continue
  fi
  only="$(comm -13 "$work/cupy.failed" "$work/$mode.failed")"
  n_only=$(printf '%s' "$only" | grep -c . || true)
  n_both=$(comm -12 "$work/cupy.failed" "$work/$mode.failed" | grep -c . || true)
  p=$(printf '%s\n' "$summary" | sed -nE 's/^(.*[^0-9])?([0-9]+) passed.*/\2/p'); p=${p:-0}
  echo "    $mode: $p passed; $n_only failing only on $mode (pass on CuPy's pool); $n_both failing on both"
  if [ -n "$only" ]; then
    printf '%s\n' "$only" | sed 's/^/    only on '"$mode"': /'
    printf '%s\n' "$out" | grep -E '^(E |FAILED|ERROR)' | head -n 60 | sed 's/^/    | /'
  fi
  if [ -z "$summary" ]; then
    n_only=$((n_only + 1)); printf '%s\n' "$out" | tail -n 40 | sed 's/^/    | /'
  fi
  passed=$((passed + p)); failed=$((failed + n_only))
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
