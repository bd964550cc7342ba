#!/usr/bin/env bash
# Call I (one H200): the suite, the history client and the examples on the final commit.
export NCCL_NVLS_ENABLE=0
B=target/gpu-bundle
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "=== suite"; VERBOSE=1 timeout 240 bash $B/run.sh tests > $OUT/suite.txt 2>&1; echo "rc=$?"
grep -E "^(ok|FAILED) |GPU suite|two-GPU" $OUT/suite.txt
echo "=== history-client"; CLIENT_ARGS="--only history" VERBOSE=1 timeout 120 bash $B/run.sh clients cupy > $OUT/clients_history.txt 2>&1; echo "rc=$?"; grep -E "^(ok|FAILED)|GPU suite" $OUT/clients_history.txt
echo "=== graph client (CuPy captures, private pools)"; CLIENT_ARGS="--only graph" VERBOSE=1 timeout 120 bash $B/run.sh clients cupy > $OUT/clients_graph.txt 2>&1; echo "rc=$?"; grep -E "^(ok|FAILED)|GPU suite" $OUT/clients_graph.txt
echo "=== examples"; timeout 150 bash $B/run.sh examples > $OUT/examples.txt 2>&1; echo "exits: $(grep -c '(exit 0)' $OUT/examples.txt) zero, nonzero: $(grep '(exit [1-9]' $OUT/examples.txt | wc -l)"
