#!/usr/bin/env bash
# Call U (two GPUs): the whole suite, the two-GPU tests included.
export NCCL_NVLS_ENABLE=0
B=target/gpu-bundle
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
VERBOSE=1 timeout 400 bash $B/run.sh tests > $OUT/suite.txt 2>&1; echo "rc=$?"
grep -E "^(ok|FAILED) |GPU suite|two-GPU|launches_on_two|peer_copies|panicked" $OUT/suite.txt | cut -c1-200
