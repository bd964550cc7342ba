#!/usr/bin/env bash
export NCCL_NVLS_ENABLE=0
B=target/gpu-bundle
echo "=== suite"; VERBOSE=1 timeout 240 bash $B/run.sh tests > $OUT/suite.txt 2>&1; grep -E "^FAILED|GPU suite" $OUT/suite.txt
echo "=== dlpack clients"; VERBOSE=1 timeout 200 bash $B/run.sh clients dlpack > $OUT/clients_dlpack.txt 2>&1; grep -E "^(ok|FAILED)|GPU suite" $OUT/clients_dlpack.txt
echo "=== plain ptds x2"; for i in 1 2; do CLIENT_ARGS="--only plain_ptds_threads --seconds 10" VERBOSE=1 timeout 80 bash $B/run.sh clients cupy > $OUT/ptds_$i.txt 2>&1; grep -E "^    \| --- |FAIL:" $OUT/ptds_$i.txt | cut -c1-160; done
