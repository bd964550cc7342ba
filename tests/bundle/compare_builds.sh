#!/usr/bin/env bash
# Runs the pool and wrapper benchmarks of two bundles (e.g. the CUDA 13.0 build and the CUDA
# 12.4 build) in one session, alternating A B A B, and prints each row's figure from both with
# their ratio (B / A; the median of the runs of each build).
# Usage: compare_builds.sh BUNDLE_A BUNDLE_B [ROUNDS (default 3)] [OUT_DIR]
set -u
a="${1:?bundle A (e.g. target/gpu-bundle)}"
b="${2:?bundle B (e.g. target/gpu-bundle-12.4)}"
rounds="${3:-3}"
out="${4:-${OUT:-.}/compare-builds}"
mkdir -p "$out"
for round in $(seq 1 "$rounds"); do
  for side in A B; do
    dir="$a"; [ "$side" = B ] && dir="$b"
    for bench in bench_pool bench_core; do
      mkdir -p "$out/$side-$round"
      BENCH_OUT="$out/$side-$round" "$dir/bench/$bench" > "$out/$side-$round-$bench.txt" 2>&1 \
        || echo "($side round $round: $bench exited $?)"
    done
  done
done
python3 - "$out" "$rounds" "$a" "$b" <<'EOF'
import csv, statistics, sys, os
out, rounds, a, b = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rows = {}
for side in "AB":
    for r in range(1, rounds + 1):
        path = os.path.join(out, f"{side}-{r}", "results.csv")
        if not os.path.exists(path):
            continue
        for row in csv.DictReader(open(path)):
            key = (row["bench"], row["scenario"], row["unit"])
            rows.setdefault(key, {"A": [], "B": []})[side].append(float(row["ours"]))
print(f"A = {a}\nB = {b}")
print(f"{'bench':<11} {'scenario':<36} {'A (median)':>14} {'B (median)':>14} {'B/A':>7}")
for (bench, scenario, unit), v in sorted(rows.items()):
    if not v["A"] or not v["B"]:
        continue
    ma, mb = statistics.median(v["A"]), statistics.median(v["B"])
    ratio = mb / ma if ma else float("nan")
    print(f"{bench:<11} {scenario:<36} {ma:>10.3f} {unit:<3} {mb:>10.3f} {unit:<3} {ratio:>7.3f}")
EOF
