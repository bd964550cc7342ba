#!/usr/bin/env bash
# Round 14, call 2: the fault path through the C ABI (PyTorch and CuPy with the pool
# installed: clients_torch/clients_cupy "fault"), gpu_fault_reset's child run alone with its
# new diagnostics (and a gdb dump of every thread if it hangs), the supervised fault_service
# example, then every client (run.sh clients, shortened stress) and bench_pool.
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
echo "=== fault through the C ABI  [$(( $(date +%s) - t0 )) s]"
timeout 120 python3 $B/clients_torch.py --lib $LIB --only fault 2>&1 | tee $OUT/clients_torch_fault.txt | grep -vE "^    (PASS|  File|    )" | head -40
timeout 120 python3 $B/clients_cupy.py --lib $LIB --only fault 2>&1 | tee $OUT/clients_cupy_fault.txt | grep -vE "^    (PASS|  File|    )" | head -40
echo "=== device-reset child alone  [$(( $(date +%s) - t0 )) s]"
RUST_BACKTRACE=1 $B/helpers/test_child device-reset 20 > $OUT/reset_child.txt 2>&1 &
pid=$!
for i in $(seq 1 60); do kill -0 $pid 2>/dev/null || break; sleep 1; done
if kill -0 $pid 2>/dev/null; then
  echo "still running after 60 s"
  if command -v gdb >/dev/null; then timeout 60 gdb -q -batch -ex "thread apply all bt 25" -p $pid > $OUT/reset_gdb.txt 2>&1; grep -E "^Thread|^#" $OUT/reset_gdb.txt | head -120; else echo "no gdb"; fi
  kill -9 $pid
fi
wait $pid; echo "rc $?"
grep -vE "^\s+[0-9]+: |^\s+at " $OUT/reset_child.txt | head -40
echo "=== fault_service example  [$(( $(date +%s) - t0 )) s]"
timeout 60 $B/examples/fault_service 2>&1 | tee $OUT/fault_service.txt; echo "rc ${PIPESTATUS[0]}"
echo "=== bench_pool  [$(( $(date +%s) - t0 )) s]"
timeout 90 $B/bench/bench_pool > $OUT/bench_pool.txt 2>&1; echo "rc $?"; tail -30 $OUT/bench_pool.txt
echo "=== run.sh clients (CLIENT_ARGS=--seconds 10 --streams 2000)  [$(( $(date +%s) - t0 )) s]"
CLIENT_ARGS="--seconds 10 --streams 2000" timeout $(( 560 - ($(date +%s) - t0) )) bash $B/run.sh clients > $OUT/clients.txt 2>&1; echo "rc $?"
grep -E "^(ok|FAILED) |passed|^    (FAIL|=== )" $OUT/clients.txt | head -80
echo "[$(( $(date +%s) - t0 )) s]"
