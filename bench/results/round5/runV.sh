#!/usr/bin/env bash
# Call V (one H200): the suite on the review pass; the CuPy history client and plain first touch.
export NCCL_NVLS_ENABLE=0
B=target/gpu-bundle
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
VERBOSE=1 timeout 200 bash $B/run.sh tests > $OUT/suite.txt 2>&1; echo "rc=$?"
grep -E "^(ok|FAILED) |GPU suite|two-GPU" $OUT/suite.txt
CLIENT_ARGS="--only history" VERBOSE=1 timeout 120 bash $B/run.sh clients cupy > $OUT/clients_history.txt 2>&1; grep -E "^(ok|FAILED) |--- |GPU suite" $OUT/clients_history.txt
