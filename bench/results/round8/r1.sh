#!/usr/bin/env bash
# Round 8, call 1 (#48's capture gate as a type; #47's acceptance on today's code): the GPU
# suite; the soundness round-3 tests; memcheck on the new tests; the CuPy and PyTorch
# clients; bench_pool's pool pairs and bench_core's launch rows of the build before the
# change (.old/, d0b1843) and of this bundle, interleaved, from one run.
set -u
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
tar -xJf target/gpu-bundle.tar.xz -C target
B=target/gpu-bundle
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nv="$(python3 -c 'import nvidia; print(" ".join(nvidia.__path__))' 2>/dev/null)"
for base in $nv; do
  [ -f "$base/cu13/lib/libnvrtc.so.13" ] && export CUDA_NVRTC_LIBRARY="$base/cu13/lib/libnvrtc.so.13"
  [ -f "$base/cu13/lib/libnvJitLink.so.13" ] && export CUDA_NVJITLINK_LIBRARY="$base/cu13/lib/libnvJitLink.so.13"
done
echo "=== the GPU suite"
bash $B/run.sh tests > $OUT/suite.txt 2>&1; grep -E "GPU suite|FAILED|failed|panicked" $OUT/suite.txt | tail -15
echo "=== memcheck (round-3 tests, core soundness tests, the recording-pool test)  [$(( $(date +%s) - t0 )) s]"
for b in gpu_soundness_round3 gpu_soundness_core; do
  echo "--- memcheck $b"
  timeout 200 compute-sanitizer --tool memcheck --report-api-errors no --target-processes all --print-limit 20 $B/tests/$b --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|test result|FAILED|panicked" | head
done
timeout 90 compute-sanitizer --tool memcheck --report-api-errors no --target-processes all --print-limit 20 $B/tests/gpu_pool_lifecycle --exact a_recording_pool_does_not_synchronise_the_device_during_a_capture 2>&1 | grep -E "ERROR SUMMARY|test result|FAILED|panicked" | head
echo "=== pool pairs, before (d0b1843) / after (this bundle), 4 rounds interleaved, pinned  [$(( $(date +%s) - t0 )) s]"
bash bench/results/round8/pairs.sh 4 12 before=.old/bench_pool after=$B/bench/bench_pool | tee $OUT/pairs.txt | sort -k3,3 -k1,1 -k2,2n
echo "=== bench_core launch rows, before / after, 3 rounds interleaved, pinned  [$(( $(date +%s) - t0 )) s]"
for r in 1 2 3; do for nb in before=.old/bench_core after=$B/bench/bench_core; do
  n=${nb%%=*}; bin=${nb#*=}
  timeout 40 taskset -c 2 $bin 2>/dev/null | grep -iE "^(launch|kernel|empty)" | sed "s/^/$n $r /"
done; done | tee $OUT/core_launch.txt
echo "=== clients: cupy (6 s), torch  [$(( $(date +%s) - t0 )) s]"
CLIENT_ARGS="--seconds 6" timeout 200 bash $B/run.sh clients cupy 2>&1 | grep -E "^(=== |--- |[0-9]+ passed)|FAIL" | tail -40
left=$(( 585 - ($(date +%s) - t0) ))
[ $left -gt 60 ] && timeout $left bash $B/run.sh clients torch 2>&1 | grep -E "^(=== |--- |[0-9]+ passed)|FAIL" | tail -40
echo "[$(( $(date +%s) - t0 )) s]"
