#!/usr/bin/env bash
# Round 8, call 3 (the final bundle: vocabulary, one event type, the seam's review fixes):
# the GPU suite; memcheck on the soundness tests and the recording-pool test; every client
# (CuPy, PyTorch, IPC, DLPack); the pool pairs before (.old, d0b1843) / after (this bundle).
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
echo "=== memcheck  [$(( $(date +%s) - t0 )) s]"
for b in gpu_soundness_round3 gpu_soundness_core gpu_soundness_pool; do
  echo "--- memcheck $b"
  timeout 150 compute-sanitizer --tool memcheck --report-api-errors no --target-processes all --print-limit 20 $B/tests/$b --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|test result|FAILED|panicked" | head
done
echo "--- memcheck gpu_pool_lifecycle a_recording_pool_does_not_synchronise_the_device_during_a_capture"
timeout 90 compute-sanitizer --tool memcheck --report-api-errors no --target-processes all --print-limit 20 $B/tests/gpu_pool_lifecycle --exact a_recording_pool_does_not_synchronise_the_device_during_a_capture 2>&1 | grep -E "ERROR SUMMARY|test result|FAILED|panicked" | head
echo "=== pool pairs, before (d0b1843) / after (this bundle), 4 rounds interleaved, pinned  [$(( $(date +%s) - t0 )) s]"
bash bench/results/round8/pairs.sh 4 12 before=.old/bench_pool after=$B/bench/bench_pool > $OUT/pairs.txt
python3 - $OUT/pairs.txt <<'PY'
import sys, statistics, collections
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    n, r, row, v = line.split(); d[(row, n)].append(float(v.rstrip("ns")))
for row in sorted({k[0] for k in d}):
    b, a = d[(row, "before")], d[(row, "after")]
    print(f"{row:42s} before {statistics.median(b):6.1f} ns [{min(b):.1f}-{max(b):.1f}]  after {statistics.median(a):6.1f} ns [{min(a):.1f}-{max(a):.1f}]  after/before {statistics.median(a)/statistics.median(b):.3f}")
PY
echo "=== clients: all (cupy 6 s)  [$(( $(date +%s) - t0 )) s]"
left=$(( 585 - ($(date +%s) - t0) ))
CLIENT_ARGS="--seconds 6" timeout $left bash $B/run.sh clients 2>&1 | grep -E "^(ok|FAILED) |FAIL:" | tail -30
echo "[$(( $(date +%s) - t0 )) s]"
