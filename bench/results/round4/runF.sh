#!/usr/bin/env bash
# Call F (one H200): the suite of the final bundle, the CuPy history scenario, graph-bench,
# bench_pool (full rows, pinned) and pool pairs presplit vs this bundle.
export NCCL_NVLS_ENABLE=0
B=target/gpu-bundle
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s); END=${END:-580}
step() { echo "=== [$(( $(date +%s) - t0 ))s] $1"; }
tl() { local left=$(( END - ($(date +%s) - t0) )); [ "$left" -lt "$1" ] && echo "$left" || echo "$1"; }
tar -xJf target/bb.tar.xz -C target
step suite; VERBOSE=1 timeout $(tl 200) bash $B/run.sh tests > $OUT/suite.txt 2>&1; echo "rc=$?"
grep -E "^(ok|FAILED) |GPU suite|two-GPU" $OUT/suite.txt
step examples; timeout $(tl 120) bash $B/run.sh examples > $OUT/examples.txt 2>&1; echo "rc=$?"; grep -E "^(ok|FAILED)|examples:|GPU suite" $OUT/examples.txt | tail -30
step suite-13.5; if [ -f target/gpu-bundle-13.tar.xz ]; then tar -xJf target/gpu-bundle-13.tar.xz -C target && timeout $(tl 150) bash target/gpu-bundle-13.5/run.sh tests > $OUT/suite135.txt 2>&1; grep -E "^FAILED|GPU suite" $OUT/suite135.txt; fi
step probe; /opt/torch/.venv/bin/python3 -c "import cuda.core as cc; print('cuda.core', getattr(cc,'__version__','?')); gb=cc.Device(0); gb.set_current(); b=gb.create_graph_builder(); print([a for a in dir(b) if not a.startswith('_')]); import cuda.core as m; print([a for a in dir(m) if 'raph' in a or 'ond' in a])" 2>&1 | tail -4
step history-client; CLIENT_ARGS="--only history" VERBOSE=1 timeout $(tl 120) bash $B/run.sh clients cupy > $OUT/clients_history.txt 2>&1; echo "rc=$?"; grep -E "^(ok|FAILED)|GPU suite|PASS|FAIL|INFO|memory_viz" $OUT/clients_history.txt | head -20
step graph-bench; timeout $(tl 120) bash $B/run.sh graph-bench > $OUT/graph_bench.txt 2>&1; grep -E "\||cuda.core" $OUT/graph_bench.txt
step bench_pool; timeout $(tl 60) taskset -c 2 $B/bench/bench_pool > $OUT/bench_pool.txt 2>&1; head -14 $OUT/bench_pool.txt
step pairs; timeout $(tl 120) bash target/gpu-scripts/pairs2.sh 4 6 presplit=target/bb/bench_pool_presplit A=target/bb/bench_pool_A head=$B/bench/bench_pool > $OUT/pairs.txt 2>&1; python3 target/gpu-scripts/summ.py $OUT/pairs.txt

step rtc-bench; [ $(( END - ($(date +%s) - t0) )) -gt 90 ] && timeout $(tl 120) bash $B/run.sh rtc-bench > $OUT/rtc_bench.txt 2>&1; grep -E "\|" $OUT/rtc_bench.txt | head -20
step end
