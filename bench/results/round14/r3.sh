#!/usr/bin/env bash
# Round 14, call 3 (two H200s): after the review fixes. The driver's floor (reset probe,
# libcuda alone), the device-reset child alone (every crate called again after the fault;
# gdb on a hang), the C ABI fault scenarios, the whole GPU suite with the two-GPU tests
# (verbose), the new NCCL peer-fault test (a fault on GPU 0 under a two-GPU communicator),
# and bench_async with its two diagnostic pipeline rows.
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
left() { echo $(( 575 - ($(date +%s) - t0) )); }
tar -xJf target/gpu-bundle.tar.xz -C target
B=$PWD/target/gpu-bundle
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
here=$B; eval "$(sed -n '/^export NCCL_NVLS_ENABLE/,/^test_timeout=/p' $B/run.sh)"
export CUDA_RS_BUNDLE_DIR=$B
LIB=$B/lib/libcudars_mempool_capi.so
echo "=== the driver's floor: reset probe (libcuda alone)  [$(( $(date +%s) - t0 )) s]"
timeout 70 python3 bench/results/round13/reset_probe.py 2>&1 | tee $OUT/reset_probe.txt
echo "=== device-reset child  [$(( $(date +%s) - t0 )) s]"
RUST_BACKTRACE=1 $B/helpers/test_child device-reset 20 > $OUT/reset_child.txt 2>&1 &
pid=$!
for i in $(seq 1 45); do kill -0 $pid 2>/dev/null || break; sleep 1; done
if kill -0 $pid 2>/dev/null; then
  echo "still running after 45 s"
  if command -v gdb >/dev/null; then timeout 40 gdb -q -batch -ex "thread apply all bt 25" -p $pid > $OUT/reset_gdb.txt 2>&1; grep -E "^Thread|^#" $OUT/reset_gdb.txt | head -150; else echo "no gdb"; fi
  kill -9 $pid
fi
wait $pid; echo "rc $?"
grep -vE "^\s+[0-9]+: |^\s+at " $OUT/reset_child.txt | head -20
echo "=== NCCL peer fault (two GPUs)  [$(( $(date +%s) - t0 )) s]"
timeout 150 $B/tests/gpu_nccl a_fault_on_one_gpu --test-threads=1 --nocapture > $OUT/nccl_peer_fault.txt 2>&1; echo "rc $?"
grep -E "NCCL_PEER_FAULT|test result|panicked|child failed" $OUT/nccl_peer_fault.txt | head -10
echo "=== fault through the C ABI  [$(( $(date +%s) - t0 )) s]"
timeout 60 python3 $B/clients_torch.py --lib $LIB --only fault 2>&1 | tee $OUT/clients_torch_fault.txt | grep -E "INFO|FAIL|passed"
timeout 60 python3 $B/clients_cupy.py --lib $LIB --only fault 2>&1 | tee $OUT/clients_cupy_fault.txt | grep -E "INFO|FAIL|passed"
echo "=== the GPU suite, two-GPU tests included  [$(( $(date +%s) - t0 )) s]"
VERBOSE=1 timeout $(( $(left) - 170 )) bash $B/run.sh tests > $OUT/suite.txt 2>&1; echo "rc $?"
grep -E "^(ok|FAILED)|GPU suite|^---" $OUT/suite.txt | grep -vE "^ok "
grep -E "FAULT_ROUND|DEVICE_RESET" $OUT/suite.txt | sed 's/^ *| *//' | head -4
grep -B2 -A25 "panicked" $OUT/suite.txt | grep -v "gpu_stream_event.rs:323\|deliberate panic\|^    |    [0-9]: \|callback\|rust_begin_unwind\|panic_fmt" | head -60
echo "=== bench_async  [$(( $(date +%s) - t0 )) s]"
timeout $(( $(left) )) $B/bench/bench_async > $OUT/bench_async.txt 2>&1; echo "rc $?"
grep -E "^wake_median|^wake_p99_warm|^wait_cpu_(parked|warm)|^pipeline|^--|^reactor" $OUT/bench_async.txt
echo "[$(( $(date +%s) - t0 )) s]"
