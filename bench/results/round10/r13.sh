#!/usr/bin/env bash
# Round 10, call 13: the whole GPU suite on the final commit (gpu_gpt2 included).
set -u
cd "$(dirname "$0")/../../.."
tar -xJf target/gpu-bundle.tar.xz -C target
B=target/gpu-bundle
cp tests/bundle/*.py $B/; cp examples/gpt2/reference/train_gpt2_ref.py $B/
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 400 bash $B/run.sh tests > $OUT/suite.txt 2>&1; grep -E "^(ok|FAILED)|GPU suite" $OUT/suite.txt | grep -vE "^ok " ; grep -E "gpu_blas|gpu_rand|gpu_gpt2|GPU suite" $OUT/suite.txt
grep -A30 "^FAILED" $OUT/suite.txt | head -40
