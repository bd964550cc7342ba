#!/usr/bin/env bash
# bench_pool's pool_pair rows (with and without the capture check) of several builds,
# interleaved, pinned to one core, each run cut after its pair rows. Usage: pairs2.sh ROUNDS SECS name=binary ...
rounds=$1; secs=$2; shift 2
for r in $(seq 1 "$rounds"); do
  for nb in "$@"; do
    name=${nb%%=*}; bin=${nb#*=}
    timeout "$secs" taskset -c 2 "$bin" 2>/dev/null | grep -E "^pool_pair_(without_capture_check_)?(512B|1MiB|64MiB) " | awk -v n="$name" -v r="$r" -F'|' '{gsub(/ +$/,"",$1); gsub(/ /,"",$2); print n, r, $1, $2}'
  done
done
