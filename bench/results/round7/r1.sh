#!/usr/bin/env bash
# Round 7, call 1: the GPU suite of the new code, the soundness round 3 tests on the old code
# (5d4c7de, the main this round started from) and on the new, and memcheck on the new tests.
set -u
cd "$(dirname "$0")/../../.."
tar -xJf target/gpu-bundle.tar.xz -C target
B=target/gpu-bundle
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# NVRTC as run.sh finds it (pip's wheel), for the binaries run by hand below.
nv="$(python3 -c 'import nvidia; print(" ".join(nvidia.__path__))' 2>/dev/null)"
for base in $nv; do
  [ -f "$base/cu13/lib/libnvrtc.so.13" ] && export CUDA_NVRTC_LIBRARY="$base/cu13/lib/libnvrtc.so.13"
  [ -f "$base/cu13/lib/libnvJitLink.so.13" ] && export CUDA_NVJITLINK_LIBRARY="$base/cu13/lib/libnvJitLink.so.13"
done
echo "=== the GPU suite (new code)"
bash $B/run.sh tests 2>&1 | tee $OUT/suite.txt | grep -vE '^    \|' 
[ -f .old/old.tar.xz ] && mkdir -p old && tar -xJf .old/old.tar.xz -C old
R3="an_edited_header_changes_the_kernel_that_runs a_planted_cache_entry_is_never_loaded a_shared_mapping_dropped_during_another_threads_capture_outlives_its_kernel device_memory_dropped_during_a_capture_is_freed_after_it stream_ordered_memory_dropped_during_its_streams_capture_is_freed_after_it a_graph_host_node_that_drops_memory_releases_it_off_the_driver_thread a_host_function_completion_wakes_the_task_off_the_driver_thread"
for side in ${SIDES:-old new}; do
  echo "=== soundness round 3 tests on the $side code"
  if [ $side = old ]; then r3=old/gpu_soundness_round3; pl=old/gpu_pool_lifecycle; else r3=$B/tests/gpu_soundness_round3; pl=$B/tests/gpu_pool_lifecycle; fi
  for t in $R3; do
    echo "--- $side $t"
    timeout 60 $r3 --exact $t --nocapture --test-threads=1 2>&1 | grep -vE '^\s*$|^running|^test result' | head -20
    echo "    (exit ${PIPESTATUS[0]})"
  done
  echo "--- $side a_recording_pool_does_not_synchronise_the_device_during_a_capture"
  timeout 60 $pl --exact a_recording_pool_does_not_synchronise_the_device_during_a_capture --nocapture 2>&1 | grep -vE '^\s*$|^running' | head -20
  echo "    (exit ${PIPESTATUS[0]})"
done 2>&1 | tee $OUT/old_new.txt
echo "=== memcheck on the new tests"
for b in gpu_soundness_round3 gpu_soundness_core; do
  echo "--- memcheck $b"
  timeout 240 compute-sanitizer --tool memcheck --report-api-errors no --target-processes all --print-limit 20 $B/tests/$b --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|test result|FAILED|panicked" | head
done
echo "--- memcheck gpu_pool_lifecycle (a_recording_pool...)"
timeout 120 compute-sanitizer --tool memcheck --report-api-errors no --target-processes all --print-limit 20 $B/tests/gpu_pool_lifecycle --exact a_recording_pool_does_not_synchronise_the_device_during_a_capture 2>&1 | grep -E "ERROR SUMMARY|test result|FAILED|panicked" | head
