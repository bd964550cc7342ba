#!/usr/bin/env bash
# Call L: how often plain_ptds_threads fails, and memcheck on it.
export NCCL_NVLS_ENABLE=0
B=target/gpu-bundle
for i in 1 2 3; do CLIENT_ARGS="--only ptds_threads --seconds 15" VERBOSE=1 timeout 100 bash $B/run.sh clients cupy > $OUT/ptds_$i.txt 2>&1; grep -E "^    \| --- |FAIL:" $OUT/ptds_$i.txt | cut -c1-200; done
CLIENT_ARGS="--only plain_ptds_threads" VERBOSE=1 timeout 200 bash $B/run.sh clients-sanitize cupy > $OUT/ptds_sanitize.txt 2>&1; echo "rc=$?"; grep -E "--- |FAIL:|ERROR SUMMARY|Invalid|at 0x|by thread|Address" $OUT/ptds_sanitize.txt | head -30 | cut -c1-220
