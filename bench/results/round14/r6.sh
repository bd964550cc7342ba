#!/usr/bin/env bash
# Round 14, call 6 (final code: health::enter with one thread-local access): bench_core
# (the core overheads that call 1 found over their 1.03 target), bench_pool's pairs, the
# device-reset child, the C ABI fault scenarios, and the whole GPU suite.
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
echo "=== bench_core  [$(( $(date +%s) - t0 )) s]"
timeout 60 $B/bench/bench_core > $OUT/bench_core.txt 2>&1; echo "rc $?"; cat $OUT/bench_core.txt | tail -9
echo "=== bench_pool  [$(( $(date +%s) - t0 )) s]"
timeout 60 $B/bench/bench_pool > $OUT/bench_pool.txt 2>&1; echo "rc $?"; grep -E "^(pool_pair_512B|pool_pair_external|capi_part|external_part_pair)" $OUT/bench_pool.txt
echo "=== device-reset child  [$(( $(date +%s) - t0 )) s]"
timeout 45 $B/helpers/test_child device-reset 20 > $OUT/reset_child.txt 2>&1; echo "rc $?"
grep -E "FAULT_ROUND|DEVICE_RESET|panicked" $OUT/reset_child.txt | head -4
echo "=== fault through the C ABI  [$(( $(date +%s) - t0 )) s]"
timeout 60 python3 $B/clients_torch.py --lib $LIB --only fault 2>&1 | tee $OUT/clients_torch_fault.txt | grep -E "INFO: pool|FAIL|passed"
timeout 60 python3 $B/clients_cupy.py --lib $LIB --only fault 2>&1 | tee $OUT/clients_cupy_fault.txt | grep -E "INFO: pool|FAIL|passed"
echo "=== the GPU suite  [$(( $(date +%s) - t0 )) s]"
VERBOSE=1 timeout 330 bash $B/run.sh tests > $OUT/suite.txt 2>&1; echo "rc $?"
grep -E "^(ok|FAILED)|GPU suite|^---" $OUT/suite.txt | grep -vE "^ok "
grep -B2 -A25 "panicked" $OUT/suite.txt | grep -v "gpu_stream_event.rs:323\|deliberate panic\|^    |    [0-9]: \|callback\|rust_begin_unwind\|panic_fmt" | head -40
echo "[$(( $(date +%s) - t0 )) s]"
