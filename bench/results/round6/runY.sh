#!/usr/bin/env bash
# Call Y (one H200): sampling profiles of bench_pool 1b79e52 and HEAD (LD_PRELOAD libsampler.so
# on the bench process only), twice each alternating; then their pairs, 3 rounds.
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
lscpu | grep -E "Model name|^CPU MHz|max MHz" ; grep -m1 "model name" /proc/cpuinfo; grep -m1 flags /proc/cpuinfo | tr ' ' '\n' | grep -c .
tar -xJf target/bisc.tar.xz -C target
B=target/bisc
for r in 1 2; do
for c in 1b79e52 1243ff2; do
  timeout 8 taskset -c 2 env SAMPLER_EXE=bench_pool SAMPLER_OUT=$OUT/prof_${c}_$r SAMPLER_SECS=5 LD_PRELOAD=$PWD/target/gpu-scripts/libsampler.so $B/bench_pool_$c > $OUT/prof_out_${c}_$r.txt 2>&1
  grep -E "^pool_pair_(1MiB|512B) " $OUT/prof_out_${c}_$r.txt | sed "s/^/$c $r /" | cut -c1-80
done; done
ls $OUT
bash target/gpu-scripts/pairs2.sh 3 6 a=$B/bench_pool_1b79e52 head=$B/bench_pool_1243ff2 noinl=$B/bench_pool_noinl > $OUT/pairs.txt 2>&1
python3 target/gpu-scripts/summ.py $OUT/pairs.txt
