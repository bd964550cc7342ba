#!/usr/bin/env bash
# Round 14, call 4 (two H200s): the NCCL suite after cuda-nccl's lost-context rules (with the
# new peer-fault test), whether GPU 1 works after a fault on GPU 0 with no peer mapping (a
# measurement of the driver), the C ABI fault scenarios after the legacy-stream probe
# change, and bench_nccl --captured (100 all_reduces launched against captured, beside
# torch.distributed launched and captured with torch.cuda.graph).
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
echo "=== GPU 1 after a fault on GPU 0  [$(( $(date +%s) - t0 )) s]"
timeout 30 $B/helpers/test_child other-gpu-after-fault 2>&1 | grep -vE "^\s+[0-9]+: |^\s+at " | tee $OUT/other_gpu.txt | head -8
echo "=== fault through the C ABI  [$(( $(date +%s) - t0 )) s]"
timeout 60 python3 $B/clients_torch.py --lib $LIB --only fault 2>&1 | tee $OUT/clients_torch_fault.txt | grep -E "INFO|FAIL|passed"
timeout 60 python3 $B/clients_cupy.py --lib $LIB --only fault 2>&1 | tee $OUT/clients_cupy_fault.txt | grep -E "INFO|FAIL|passed"
echo "=== run.sh nccl tests  [$(( $(date +%s) - t0 )) s]"
VERBOSE=1 timeout 300 bash $B/run.sh nccl tests > $OUT/nccl_tests.txt 2>&1; echo "rc $?"
grep -E "^(ok|FAILED) |GPU suite|NCCL_PEER_FAULT" $OUT/nccl_tests.txt | sed 's/^ *| *//' | head -8
grep -B2 -A20 "panicked" $OUT/nccl_tests.txt | head -40
echo "=== bench_nccl --captured  [$(( $(date +%s) - t0 )) s]"
timeout $(( 560 - ($(date +%s) - t0) )) $B/bench/bench_nccl --captured > $OUT/bench_nccl_captured.txt 2>&1; echo "rc $?"
tail -30 $OUT/bench_nccl_captured.txt
echo "[$(( $(date +%s) - t0 )) s]"
