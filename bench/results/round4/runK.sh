#!/usr/bin/env bash
# Call K (one H200): the real clients on the final bundle: every CuPy client scenario, the
# PyTorch clients, CuPy's own test files on CuPy's pool, ours and the plain route.
export NCCL_NVLS_ENABLE=0
B=target/gpu-bundle
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
echo "=== cupy clients"; VERBOSE=1 timeout 420 bash $B/run.sh clients cupy > $OUT/clients_cupy.txt 2>&1; echo "rc=$? [$(( $(date +%s)-t0 ))s]"
grep -E "^(ok|FAILED)|GPU suite|--- |FAIL:" $OUT/clients_cupy.txt | head -40
grep -E "PASS: (card|limit|plain route)" $OUT/clients_cupy.txt | head -6 | cut -c1-260
echo "=== torch clients"; VERBOSE=1 timeout 120 bash $B/run.sh clients torch > $OUT/clients_torch.txt 2>&1; echo "rc=$? [$(( $(date +%s)-t0 ))s]"
grep -E "^(ok|FAILED)|GPU suite|--- " $OUT/clients_torch.txt | head -20
echo "=== cupy own tests"; (cd $B && timeout 100 bash cupy_own_tests.sh) > $OUT/cupy_own_tests.txt 2>&1; echo "rc=$? [$(( $(date +%s)-t0 ))s]"; grep -vE "^\s*$" $OUT/cupy_own_tests.txt | tail -8
