#!/usr/bin/env bash
# Call Z (one H200): pool pairs of 1b79e52 (presplit) / HEAD / fast4 (inlined malloc fast path)
# / fast10 (plus scalar-argument free, no Result shuffle in release), pinned, 4 rounds
# interleaved; a sampling profile of fast10.
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
tar -xJf target/bisd.tar.xz -C target
B=target/bisd
bash target/gpu-scripts/pairs2.sh 4 6 a=$B/bench_pool_1b79e52 head=$B/bench_pool_1243ff2 fast4=$B/bench_pool_fast4 fast10=$B/bench_pool_fast10 > $OUT/pairs.txt 2>&1
python3 target/gpu-scripts/summ.py $OUT/pairs.txt
timeout 8 taskset -c 2 env SAMPLER_EXE=bench_pool SAMPLER_OUT=$OUT/prof_fast10 SAMPLER_SECS=5 LD_PRELOAD=$PWD/target/gpu-scripts/libsampler.so $B/bench_pool_fast10 > /dev/null 2>&1
ls $OUT
