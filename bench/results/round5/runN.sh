#!/usr/bin/env bash
# Call N: the plain route's first-touch race, old library (a32dce6) against the fix; then
# plain_ptds_threads repeated.
export NCCL_NVLS_ENABLE=0
B=target/gpu-bundle
OLD=$(pwd)/target/gpu-scripts/oldlib/libcudars_mempool_capi.so
echo "=== OLD library: plain_first_touch"
timeout 200 python3 $B/clients_cupy.py --lib $OLD --only plain_first_touch > $OUT/first_touch_old.txt 2>&1; echo "rc=$?"
grep -E "PASS|FAIL|passed" $OUT/first_touch_old.txt | cut -c1-400 | head -20
echo "=== NEW library: plain_first_touch"
CLIENT_ARGS="--only plain_first_touch" VERBOSE=1 timeout 200 bash $B/run.sh clients cupy > $OUT/first_touch_new.txt 2>&1; echo "rc=$?"
grep -E "PASS|FAIL|passed|INFO" $OUT/first_touch_new.txt | cut -c1-300 | head -20
for i in 1 2 3 4; do
  CLIENT_ARGS="--only ptds_threads --seconds 8" VERBOSE=1 timeout 100 bash $B/run.sh clients cupy > $OUT/ptds_$i.txt 2>&1
  grep -E "^    \| --- |FAIL:|GPU suite" $OUT/ptds_$i.txt | cut -c1-200
done
