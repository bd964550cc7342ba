#!/usr/bin/env bash
# Call X (one H200): pool pair of 1b79e52 / e09246d / 76e2401 / 3329b07 / HEAD / HEAD without
# the free's #[inline] (noinl), pinned, 3 rounds interleaved; then a sampling profile of four
# (LD_PRELOAD libsampler.so: a 20 us wall-clock timer signal records the interrupted address).
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
tar -xJf target/bisc.tar.xz -C target
B=target/bisc
args=""
for c in 1b79e52 e09246d 76e2401 3329b07 1243ff2 noinl; do args="$args $c=$B/bench_pool_$c"; done
bash target/gpu-scripts/pairs2.sh 3 6 $args > $OUT/pairs.txt 2>&1
python3 target/gpu-scripts/summ.py $OUT/pairs.txt
for c in 1b79e52 e09246d 1243ff2 noinl; do
  SAMPLER_OUT=$OUT/prof_$c.txt SAMPLER_SECS=5 LD_PRELOAD=$PWD/target/gpu-scripts/libsampler.so timeout 7 taskset -c 2 $B/bench_pool_$c > $OUT/prof_out_$c.txt 2>&1
  echo "$c: $(grep -c '^rip' $OUT/prof_$c.txt) addresses"
done
grep -E "^pool_pair_(1MiB|512B) " $OUT/prof_out_*.txt
