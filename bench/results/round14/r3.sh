#!/usr/bin/env bash
# Round 14, call 3: after cuda-nccl's lost-context rules (probe after an NCCL error, no
# destroy of a lost communicator) and the device-reset child's cuda-rtc / NCCL / cuda-xfer
# work. The child alone three times (the worker start that timed out in call 1; gdb on a
# hang), the C ABI fault scenarios, the whole GPU suite (verbose), bench_async with its two
# new diagnostic pipeline rows, and the CuPy allocation benchmark (the pool's watch is on
# every allocation now).
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
tar -xJf target/gpu-bundle.tar.xz -C target
B=$PWD/target/gpu-bundle
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
here=$B; eval "$(sed -n '/^export NCCL_NVLS_ENABLE/,/^test_timeout=/p' $B/run.sh)"
export CUDA_RS_BUNDLE_DIR=$B
LIB=$B/lib/libcudars_mempool_capi.so
for run in 1 2 3; do
  echo "=== device-reset child, run $run  [$(( $(date +%s) - t0 )) s]"
  RUST_BACKTRACE=1 $B/helpers/test_child device-reset 20 > $OUT/reset_child_$run.txt 2>&1 &
  pid=$!
  for i in $(seq 1 50); do kill -0 $pid 2>/dev/null || break; sleep 1; done
  if kill -0 $pid 2>/dev/null; then
    echo "still running after 50 s"
    if command -v gdb >/dev/null; then timeout 60 gdb -q -batch -ex "thread apply all bt 25" -p $pid > $OUT/reset_gdb_$run.txt 2>&1; grep -E "^Thread|^#" $OUT/reset_gdb_$run.txt | head -150; else echo "no gdb"; fi
    kill -9 $pid
  fi
  wait $pid; echo "rc $?"
  grep -vE "^\s+[0-9]+: |^\s+at " $OUT/reset_child_$run.txt | head -20
done
echo "=== the driver's floor: reset probe (libcuda alone)  [$(( $(date +%s) - t0 )) s]"
timeout 90 python3 bench/results/round13/reset_probe.py 2>&1 | tee $OUT/reset_probe.txt
echo "=== fault through the C ABI  [$(( $(date +%s) - t0 )) s]"
timeout 120 python3 $B/clients_torch.py --lib $LIB --only fault 2>&1 | tee $OUT/clients_torch_fault.txt | grep -E "INFO|FAIL|passed"
timeout 120 python3 $B/clients_cupy.py --lib $LIB --only fault 2>&1 | tee $OUT/clients_cupy_fault.txt | grep -E "INFO|FAIL|passed"
echo "=== the GPU suite  [$(( $(date +%s) - t0 )) s]"
VERBOSE=1 timeout 260 bash $B/run.sh tests > $OUT/suite.txt 2>&1
grep -E "^(ok|FAILED)|GPU suite" $OUT/suite.txt | grep -vE "^ok "
grep -E "FAULT_ROUND|DEVICE_RESET|GPU suite" $OUT/suite.txt | sed 's/^ *| *//' | head -6
grep -B2 -A25 "panicked" $OUT/suite.txt | grep -v "gpu_stream_event.rs:323\|deliberate panic\|^    |    [0-9]: \|callback" | head -60
echo "=== bench_async  [$(( $(date +%s) - t0 )) s]"
timeout 240 $B/bench/bench_async > $OUT/bench_async.txt 2>&1; echo "rc $?"
grep -E "^wake_median|^wake_p99_warm|^wait_cpu_(parked|warm)|^pipeline|^--|^reactor" $OUT/bench_async.txt
echo "=== cupy_alloc_bench  [$(( $(date +%s) - t0 )) s]"
timeout 100 python3 $B/cupy_alloc_bench.py --lib $LIB > $OUT/cupy_alloc_bench.txt 2>&1; echo "rc $?"; tail -25 $OUT/cupy_alloc_bench.txt
echo "[$(( $(date +%s) - t0 )) s]"
