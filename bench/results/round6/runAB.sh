#!/usr/bin/env bash
# Call AB (one H200), commit 0854e58: suite; the new per-thread OOM test on a build without the
# recovery step (expected to fail); compute-sanitizer memcheck on the pool's GPU test binaries;
# the PyTorch clients; the pool pairs pinned.
export NCCL_NVLS_ENABLE=0
B=target/gpu-bundle
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s); END=${END:-585}
step() { echo "=== [$(( $(date +%s) - t0 ))s] $1"; }
tl() { local left=$(( END - ($(date +%s) - t0) )); [ "$left" -lt "$1" ] && echo "$left" || echo "$1"; }
tar -xJf target/nofix.tar.xz -C target
nv_dirs="$(python3 -c 'import nvidia; print(" ".join(nvidia.__path__))' 2>/dev/null)"
for base in $nv_dirs; do
  [ -f "$base/cu13/lib/libnvrtc.so.13" ] && [ -z "${CUDA_NVRTC_LIBRARY:-}" ] && export CUDA_NVRTC_LIBRARY="$base/cu13/lib/libnvrtc.so.13"
  [ -f "$base/cu13/lib/libnvJitLink.so.13" ] && [ -z "${CUDA_NVJITLINK_LIBRARY:-}" ] && export CUDA_NVJITLINK_LIBRARY="$base/cu13/lib/libnvJitLink.so.13"
done
step suite; VERBOSE=1 timeout $(tl 160) bash $B/run.sh tests > $OUT/suite.txt 2>&1; echo "rc=$?"
grep -E "^(ok|FAILED) |GPU suite|two-GPU" $OUT/suite.txt
grep -E "out_of_memory_recovers" $OUT/suite.txt | head -3
T=out_of_memory_recovers_blocks_freed_for_another_threads_per_thread_stream
step "without the recovery step (f67ce39's recovery.rs)"; timeout 60 target/nofix/gpu_pool_lifecycle --exact $T --test-threads=1 > $OUT/nofix.txt 2>&1; echo "rc=$?"; grep -E "panicked|recovered|test result" -A1 $OUT/nofix.txt | head -6
step "with it"; timeout 60 $B/tests/gpu_pool_lifecycle --exact $T --test-threads=1 2>&1 | grep -E "test result"
step sanitize; for b in gpu_pool_lifecycle gpu_handover gpu_mempool gpu_soundness_pool; do CUDA_RS_STREAMS=2000 timeout $(tl 120) compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 86 --print-limit 20 $B/tests/$b --test-threads=1 > $OUT/sanitize_$b.txt 2>&1; echo "$b rc=$? $(grep -E 'ERROR SUMMARY' $OUT/sanitize_$b.txt | tail -1) $(grep -E '^test result' $OUT/sanitize_$b.txt | tail -1)"; done
step pairs; timeout $(tl 40) bash target/gpu-scripts/pairs2.sh 2 6 bundle=$B/bench/bench_pool > $OUT/pairs.txt 2>&1; python3 target/gpu-scripts/summ.py $OUT/pairs.txt
step clients-torch; VERBOSE=1 timeout $(tl 240) bash $B/run.sh clients torch > $OUT/clients_torch.txt 2>&1; echo "rc=$?"
grep -E "^(ok|FAILED) |--- " $OUT/clients_torch.txt | cut -c1-220
step end
