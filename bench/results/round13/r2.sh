#!/usr/bin/env bash
# Round 13, call 2: after the review fixes and the reset retry. The reset probe (which driver
# sequence recovers a context after an illegal address; reset_probe.py, libcuda alone); the
# gpu_blas crash of call 1 (level_1_and_2 alone, with a backtrace, and gdb if the process dies
# of a signal); the fault_service example; the whole GPU suite, verbose (gpu_fault_reset's
# RESET_ROUND lines are in it).
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
tar -xJf target/gpu-bundle.tar.xz -C target
B=$PWD/target/gpu-bundle
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
here=$B; eval "$(sed -n '/^export NCCL_NVLS_ENABLE/,/^test_timeout=/p' $B/run.sh)"
export CUDA_RS_BUNDLE_DIR=$B
echo "=== reset probe  [$(( $(date +%s) - t0 )) s]"
timeout 60 python3 bench/results/round13/reset_probe.py 2>&1 | tee $OUT/reset_probe.txt
echo "=== gpu_blas level_1_and_2  [$(( $(date +%s) - t0 )) s]"
RUST_BACKTRACE=1 timeout 40 $B/tests/gpu_blas level_1_and_2 --test-threads=1 --nocapture > $OUT/blas_level12.txt 2>&1; rc=$?; echo "rc $rc"
tail -25 $OUT/blas_level12.txt
if [ $rc -ge 128 ] && command -v gdb >/dev/null; then
  timeout 60 gdb -q -batch -ex run -ex bt -ex "info registers rip" --args $B/tests/gpu_blas level_1_and_2 --test-threads=1 > $OUT/blas_gdb.txt 2>&1
  grep -E -A30 "received signal|SIGSEGV|SIGABRT" $OUT/blas_gdb.txt | head -45
fi
echo "=== fault_service example  [$(( $(date +%s) - t0 )) s]"
timeout 30 $B/examples/fault_service 2>&1 | tee $OUT/fault_service.txt; echo "rc ${PIPESTATUS[0]}"
echo "=== the GPU suite  [$(( $(date +%s) - t0 )) s]"
VERBOSE=1 timeout 200 bash $B/run.sh tests > $OUT/suite.txt 2>&1
grep -E "^(ok|FAILED)|GPU suite" $OUT/suite.txt | grep -vE "^ok "
grep -E "RESET_ROUND (0|1|19) |DEVICE_RESET|GPU suite" $OUT/suite.txt | sed 's/^ *| *//' | head -8
grep -B2 -A20 "panicked" $OUT/suite.txt | head -50
echo "[$(( $(date +%s) - t0 )) s]"
