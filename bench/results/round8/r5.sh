#!/usr/bin/env bash
# Round 8, call 5 (the final code, after the whole-change review): the GPU suite, and the
# real clients with every scenario's lines kept: CuPy and PyTorch (a block freed on one
# stream while a kernel writes it, then used through a synchronous call, another stream,
# the per-thread stream, a capture; streams destroyed with blocks cached; out of memory),
# then the IPC and DLPack clients' summaries.
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
tar -xJf target/gpu-bundle.tar.xz -C target
B=target/gpu-bundle
L=$B/lib/libcudars_mempool_capi.so
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "=== the GPU suite"
bash $B/run.sh tests > $OUT/suite.txt 2>&1; grep -E "GPU suite|FAILED|panicked" $OUT/suite.txt | tail -5
echo "=== clients_cupy.py --seconds 6  [$(( $(date +%s) - t0 )) s]"
timeout 200 python3 $B/clients_cupy.py --lib $L --seconds 6 > $OUT/clients_cupy.txt 2>&1
grep -E "^--- |FAIL|passed, .* failed$" $OUT/clients_cupy.txt | tail -40
echo "=== clients_torch.py  [$(( $(date +%s) - t0 )) s]"
timeout 170 python3 $B/clients_torch.py --lib $L > $OUT/clients_torch.txt 2>&1
grep -E "^--- |FAIL|passed, .* failed$" $OUT/clients_torch.txt | tail -20
left=$(( 585 - ($(date +%s) - t0) ))
echo "=== clients ipc, dlpack  [$(( $(date +%s) - t0 )) s]"
timeout $left bash $B/run.sh clients ipc 2>&1 | grep -E "^(ok|FAILED) |FAIL:" | tail -5
left=$(( 585 - ($(date +%s) - t0) ))
[ $left -gt 30 ] && timeout $left bash $B/run.sh clients dlpack 2>&1 | grep -E "^(ok|FAILED) |FAIL:" | tail -5
echo "[$(( $(date +%s) - t0 )) s]"
