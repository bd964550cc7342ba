#!/usr/bin/env bash
# Round 10, call 11: run.sh gpt2-bench (the final code), as the closing note quotes it.
set -u
cd "$(dirname "$0")/../../.."
tar -xJf target/gpu-bundle.tar.xz -C target
B=target/gpu-bundle
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 500 bash $B/run.sh gpt2-bench 2>&1 | grep -vE "^wrote" | python3 -c "
import json, sys
for line in sys.stdin:
    line = line.strip()
    if line.startswith('{'):
        d = json.loads(line)
        print(f\"torch {d['mode']} f32: {d['ms_median']:.2f} ms/step, peak {d['peak_mem_gib']:.2f} GiB\")
    elif line:
        print(line)
"
