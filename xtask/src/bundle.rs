//! `cargo xtask gpu-bundle`: every GPU test, benchmark and example binary, release mode, in
//! `target/gpu-bundle/`, with `run.sh` to run them on a machine that has a driver and no Rust.

use std::fs;
use std::path::{Path, PathBuf};

use crate::util::{cargo_json, fail, json_str, root, Result};

/// The bundle must travel to the GPU machine, which takes 64 MiB.
const MAX_BUNDLE_BYTES: u64 = 64 << 20;

/// Builds the bundle into `dir` (`target/gpu-bundle`, or `target/gpu-bundle-<SET>` for
/// another header set: see `headers::gpu_bundle_args`).
pub fn gpu_bundle_into(dir: &Path) -> Result<()> {
    let dir = dir.to_path_buf();
    if dir.exists() {
        fs::remove_dir_all(&dir).map_err(|e| format!("clean {}: {e}", dir.display()))?;
    }
    let mut total = 0;
    let tests = cargo_json(
        &[
            "test",
            "-p",
            "tests",
            "--features",
            "gpu,library-handles",
            "--release",
            "--no-run",
            "--message-format=json",
        ],
        &[],
    )?;
    total += copy_artifacts(&tests, "test", &dir.join("tests"))?;
    let bins = cargo_json(
        &[
            "build",
            "-p",
            "tests",
            "--features",
            "gpu,library-handles",
            "--release",
            "--bins",
            "--message-format=json",
        ],
        &[],
    )?;
    total += copy_artifacts(&bins, "bin", &dir.join("bench"))?;
    let examples = cargo_json(
        &[
            "build",
            "--workspace",
            "--release",
            "--examples",
            "--message-format=json",
        ],
        &[],
    )?;
    total += copy_artifacts(&examples, "example", &dir.join("examples"))?;
    // The C ABI of MemoryPool, for the PyTorch / CuPy workloads (tests/bundle/*.py).
    let capi = cargo_json(
        &[
            "build",
            "-p",
            "cuda-mempool-capi",
            "--release",
            "--message-format=json",
        ],
        &[],
    )?;
    fs::create_dir_all(dir.join("lib")).map_err(|e| e.to_string())?;
    for line in &capi {
        if !line.contains("\"reason\":\"compiler-artifact\"") || !line.contains("cuda-mempool-capi")
        {
            continue;
        }
        for path in line.split('"').filter(|p| p.ends_with(".so")) {
            let from = PathBuf::from(path);
            if let Some(name) = from.file_name() {
                let to = dir.join("lib").join(name);
                fs::copy(&from, &to).map_err(|e| format!("copy {}: {e}", from.display()))?;
                let _ = std::process::Command::new("strip")
                    .arg("--strip-debug")
                    .arg(&to)
                    .status();
                total += fs::metadata(&to).map_err(|e| e.to_string())?.len();
                println!("xtask: bundled lib/{}", name.to_string_lossy());
            }
        }
    }
    let header = root().join("cuda-mempool-capi/include/cuda_mempool.h");
    if header.is_file() {
        total += fs::copy(&header, dir.join("lib/cuda_mempool.h")).map_err(|e| e.to_string())?;
    }
    // The CuPy module loads the library from its own folder.
    let cupy_module = root().join("cuda-mempool-capi/python/cuda_mempool_cupy.py");
    if cupy_module.is_file() {
        total += fs::copy(&cupy_module, dir.join("lib/cuda_mempool_cupy.py"))
            .map_err(|e| format!("copy {}: {e}", cupy_module.display()))?;
    }
    let extra = root().join("tests/bundle");
    if extra.is_dir() {
        for entry in fs::read_dir(&extra).map_err(|e| e.to_string())? {
            let entry = entry.map_err(|e| e.to_string())?;
            let to = dir.join(entry.file_name());
            total += fs::copy(entry.path(), &to)
                .map_err(|e| format!("copy {}: {e}", entry.path().display()))?;
        }
    }
    // The recorded allocation traces, for the replay benchmark (read from the steering
    // repo's shared/ beside the checkout; absent traces leave the replay rows out, loudly).
    let traces = root().join("../shared/traces");
    if traces.is_dir() {
        fs::create_dir_all(dir.join("traces")).map_err(|e| e.to_string())?;
        for entry in fs::read_dir(&traces).map_err(|e| e.to_string())? {
            let entry = entry.map_err(|e| e.to_string())?;
            total += fs::copy(entry.path(), dir.join("traces").join(entry.file_name()))
                .map_err(|e| e.to_string())?;
        }
    } else {
        println!(
            "xtask: warning: {} not found; the bundle has no traces",
            traces.display()
        );
    }
    let run_sh = dir.join("run.sh");
    fs::write(&run_sh, RUN_SH).map_err(|e| e.to_string())?;
    make_executable(&run_sh)?;
    println!(
        "xtask: GPU bundle in {} ({:.1} MiB)",
        dir.display(),
        total as f64 / (1 << 20) as f64
    );
    let rel = dir
        .strip_prefix(root())
        .unwrap_or(&dir)
        .display()
        .to_string();
    println!("xtask: run it with a device call: carry [\"{rel}\"], command `bash {rel}/run.sh`");
    if total > MAX_BUNDLE_BYTES {
        return fail(&format!(
            "the bundle is {total} bytes, over the {MAX_BUNDLE_BYTES} that can travel"
        ));
    }
    Ok(())
}

/// Copies every executable artifact of `kind` from cargo's JSON messages into `to`; returns bytes.
fn copy_artifacts(lines: &[String], kind: &str, to: &Path) -> Result<u64> {
    fs::create_dir_all(to).map_err(|e| e.to_string())?;
    let mut bytes = 0;
    for line in lines {
        if !line.contains("\"reason\":\"compiler-artifact\"")
            || !line.contains(&format!("\"kind\":[\"{kind}\"]"))
        {
            continue;
        }
        if kind == "test" && !line.contains("\"test\":true") {
            continue;
        }
        let Some(exe) = json_str(line, "executable") else {
            continue;
        };
        let exe = PathBuf::from(exe);
        let name = json_str(line, "name").unwrap_or_default();
        // Test binaries are named <target>-<hash>; keep the target name only.
        let file = if kind == "test" {
            name.clone()
        } else {
            exe.file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or(name)
        };
        let dest = to.join(&file);
        fs::copy(&exe, &dest).map_err(|e| format!("copy {}: {e}", exe.display()))?;
        // Debug info is most of a binary's size and the bundle must stay under 64 MiB; the
        // symbols stay, so backtraces still name functions. No `strip`: keep the debug info.
        let _ = std::process::Command::new("strip")
            .arg("--strip-debug")
            .arg(&dest)
            .status();
        bytes += fs::metadata(&dest).map_err(|e| e.to_string())?.len();
        make_executable(&dest)?;
        println!("xtask: bundled {kind} {file}");
    }
    Ok(bytes)
}

fn make_executable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut perm = fs::metadata(path).map_err(|e| e.to_string())?.permissions();
    perm.set_mode(0o755);
    fs::set_permissions(path, perm).map_err(|e| e.to_string())
}

const RUN_SH: &str = r#"#!/usr/bin/env bash
# Runs the GPU bundle. Usage: run.sh [tests|sanitize|clients|clients-sanitize|bench|examples|nccl|all] [filter]
#   tests     every test binary, one line each, then "N passed, N failed" (the default)
#   sanitize  the same under compute-sanitizer --tool memcheck
#   clients   the CuPy / PyTorch client tests (clients_*.py) through lib/, one line each
#   clients-sanitize  the same, shorter, under compute-sanitizer --tool memcheck
#   bench     every benchmark binary (their own output)
#   examples  every example
#   nccl      the cuda-nccl suite (single- and multi-process, socket transport, a rank killed
#             mid-collective), then bench_nccl beside torch.distributed; needs >= 2 GPUs.
#             `run.sh nccl tests` / `run.sh nccl bench` run one part; another word filters tests
# Test binaries run with --test-threads=1 so that memory-level checks see only their own work.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
mode="${1:-tests}"
filter="${2:-}"
passed=0; failed=0
# NVLink multicast stays off on the shared machines, in every process this script starts.
export NCCL_NVLS_ENABLE=0
export CUDA_RS_BUNDLE_DIR="$here"
# cuda-nccl opens libnccl at run time: take the one of pip's nvidia-nccl-cu13 wheel (PyTorch's).
if [ -z "${CUDA_NCCL_LIBRARY:-}" ] && command -v python3 >/dev/null; then
  nccl_dir="$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)"
  if [ -n "$nccl_dir" ] && [ -f "$nccl_dir/lib/libnccl.so.2" ]; then
    export CUDA_NCCL_LIBRARY="$nccl_dir/lib/libnccl.so.2"
  fi
fi
gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')"
only=""
test_timeout=600
run_tests() {
  local wrap=("$@")
  for t in "$here"/tests/*; do
    [ -x "$t" ] || continue
    name="$(basename "$t")"
    if [ -n "$only" ] && [ "$name" != "$only" ]; then continue; fi
    if { [ "$name" = gpu_nccl ] || [ "$name" = gpu_ipc_two_gpus ]; } && [ -z "$only" ] && [ "${gpus:-0}" -lt 2 ]; then
      printf '%-8s %-28s (needs >= 2 GPUs, %s here: run it on a multi-GPU machine)\n' skipped "$name" "${gpus:-0}"
      continue
    fi
    start=$(date +%s%N)
    out="$(timeout "$test_timeout" "${wrap[@]}" "$t" --test-threads=1 $filter 2>&1)"; rc=$?
    ms=$(( ($(date +%s%N) - start) / 1000000 ))
    line="$(printf '%s\n' "$out" | grep -E '^test result:' | tail -n1)"
    p=$(printf '%s\n' "$line" | sed -nE 's/.* ([0-9]+) passed.*/\1/p'); p=${p:-0}
    f=$(printf '%s\n' "$line" | sed -nE 's/.* ([0-9]+) failed.*/\1/p'); f=${f:-0}
    # Under compute-sanitizer, a binary that makes no CUDA call (CPU-only tests) ends "before
    # the first instrumented API call": nothing to check, so its own result line decides.
    if printf '%s\n' "$out" | grep -q 'terminated before first instrumented API call'; then rc=0; fi
    if [ -z "$line" ] || { [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; }; then f=$((f + 1)); fi
    if [ "${wrap[0]:-}" = "compute-sanitizer" ] && printf '%s\n' "$out" | grep -qE 'ERROR SUMMARY: [1-9]'; then f=$((f + 1)); fi
    passed=$((passed + p)); failed=$((failed + f))
    status=ok; [ "$f" -eq 0 ] || status=FAILED
    printf '%-8s %-28s %4d passed %4d failed  %6d ms\n' "$status" "$name" "$p" "$f" "$ms"
    if [ "$f" -ne 0 ] || [ -n "${VERBOSE:-}" ]; then printf '%s\n' "$out" | sed 's/^/    | /'; fi
  done
}
run_clients() {
  # Each script prints PASS/FAIL lines and ends with "N passed, N failed"; $CLIENT_ARGS
  # (e.g. "--seconds 10 --streams 1000") is passed to each.
  for s in "$here"/clients_*.py; do
    [ -f "$s" ] || continue
    case "$s" in *_common.py) continue ;; esac
    name="$(basename "$s" .py)"
    if [ -n "$filter" ] && [[ "$name" != *"$filter"* ]]; then continue; fi
    start=$(date +%s%N)
    out="$(timeout 1500 python3 "$s" --lib "$here/lib/libcuda_mempool_capi.so" "$@" ${CLIENT_ARGS:-} 2>&1)"; rc=$?
    ms=$(( ($(date +%s%N) - start) / 1000000 ))
    line="$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -n1)"
    p=$(printf '%s\n' "$line" | sed -nE 's/^([0-9]+) passed.*/\1/p'); p=${p:-0}
    f=$(printf '%s\n' "$line" | sed -nE 's/.* ([0-9]+) failed$/\1/p'); f=${f:-0}
    if [ -z "$line" ] || { [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; }; then f=$((f + 1)); fi
    passed=$((passed + p)); failed=$((failed + f))
    status=ok; [ "$f" -eq 0 ] || status=FAILED
    printf '%-8s %-28s %4d passed %4d failed  %6d ms\n' "$status" "$name" "$p" "$f" "$ms"
    if [ "$f" -ne 0 ] || [ -n "${VERBOSE:-}" ]; then printf '%s\n' "$out" | sed 's/^/    | /'; fi
  done
}
export NCCL_NVLS_ENABLE=0
case "$mode" in
  tests) run_tests ;;
  clients) run_clients ;;
  clients-sanitize) run_clients --sanitize ;;
  sanitize) run_tests compute-sanitizer --tool memcheck --report-api-errors no --target-processes all --error-exitcode 86 --print-limit 20 ;;
  bench)
    # Rows go to $BENCH_OUT/results.csv (ours, raw) and peers.csv (CuPy, PyTorch);
    # `cargo xtask bench-report DIR` turns them into the report.
    export BENCH_OUT="${BENCH_OUT:-$here/bench-results}"; mkdir -p "$BENCH_OUT"
    export CUDA_RS_TRACES="$here/traces"
    { date -u +%Y-%m-%dT%H:%MZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n1; } > "$BENCH_OUT/meta.txt"
    for b in "$here"/bench/*; do
      [ -x "$b" ] || continue
      if [ "$(basename "$b")" = bench_nccl ] && [ "${gpus:-0}" -lt 2 ]; then echo "=== bench_nccl skipped (needs >= 2 GPUs)"; continue; fi
      echo "=== $(basename "$b")"; "$b" $filter || echo "(exit $?)"
    done
    if [ -z "$filter" ] && command -v python3 >/dev/null; then
      echo "=== peers (CuPy, PyTorch)"; python3 "$here/peers.py" --traces "$here/traces"
    fi
    exit 0 ;;
  examples)
    export CUDA_RS_TRACES="$here/traces"
    for e in "$here"/examples/*; do [ -x "$e" ] || continue; echo "=== $(basename "$e")"; "$e"; echo "(exit $?)"; done; exit 0 ;;
  nccl)
    # run.sh nccl [tests|bench|TEST-FILTER]: both parts by default.
    part="${filter:-all}"; filter=""
    case "$part" in all|tests|bench) ;; *) filter="$part"; part=tests ;; esac
    echo "CUDA_NCCL_LIBRARY=${CUDA_NCCL_LIBRARY:-unset}; GPUs: ${gpus:-0}; NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE"
    if [ "$part" != bench ]; then only=gpu_nccl; test_timeout=1800; run_tests; fi
    if [ "$part" != tests ]; then
      export BENCH_OUT="${BENCH_OUT:-$here/bench-results}"; mkdir -p "$BENCH_OUT"
      [ -f "$BENCH_OUT/meta.txt" ] || { date -u +%Y-%m-%dT%H:%MZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n1; } > "$BENCH_OUT/meta.txt"
      echo "=== bench_nccl"; "$here/bench/bench_nccl" || { echo "(exit $?)"; failed=$((failed + 1)); }
    fi ;;
  all) "$0" examples; run_tests; "$0" bench; ;;
  *) echo "usage: run.sh [tests|sanitize|clients|clients-sanitize|bench|examples|nccl|all] [filter]"; exit 2 ;;
esac
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
"#;
