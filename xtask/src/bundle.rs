//! `cargo xtask gpu-bundle`: every GPU test, benchmark and example binary, release mode, in
//! `target/gpu-bundle/`, with `run.sh` to run them on a machine that has a driver and no Rust.
//!
//! The GPU suite's test binaries are listed once, in [`SUITE`]; `run.sh` is generated from it,
//! and `cargo xtask ci` runs the same binaries through the same `run.sh` (see [`suite_dir`]), so
//! the two paths cannot drift apart.

use std::fs;
use std::path::{Path, PathBuf};

use crate::util::{artifacts, cargo_json, cuda_sys_build, fail, root, Artifact, Result};

/// The bundle must travel to the GPU machine, which takes 64 MiB.
const MAX_BUNDLE_BYTES: u64 = 64 << 20;

/// The GPU suite: the integration-test binaries of the `tests` crate (`tests/tests/*.rs`), in
/// the order `run.sh` runs them. A test file missing here fails the build of the suite.
/// Tests that need two GPUs are `#[ignore = "needs two GPUs"]` in them; nothing else is ignored.
pub const SUITE: &[&str] = &[
    "loader",
    "no_driver",
    "gpu_foundation",
    "gpu_stream_event",
    "gpu_memory",
    "gpu_mempool",
    "gpu_graph",
    "gpu_graph_explicit",
    "gpu_xfer",
    "gpu_misc",
    "gpu_nvtx",
    "gpu_pool_lifecycle",
    "gpu_xfer_fault",
    "gpu_ipc",
    "gpu_handover",
    "gpu_soundness_pool",
    "gpu_soundness_core",
    "gpu_soundness_round3",
    "gpu_rtc",
    "gpu_async",
    "gpu_async_fault",
    "gpu_fault_reset",
    "gpu_dlpack",
    "gpu_blas",
    "gpu_rand",
    "gpu_fft",
    "gpu_solver",
    "gpu_sparse",
    "gpu_gpt2",
];

/// Test binaries bundled but run by their own mode, not by `run.sh tests` on one GPU: the
/// NCCL suite needs two or more GPUs and starts its own ranks (`run.sh nccl`); the two-GPU
/// IPC and peer tests run with the two-GPU tests (`run.sh two-gpu`, or after `tests` on a
/// machine with two GPUs).
const OWN_MODE: &[&str] = &["gpu_nccl", "gpu_ipc_two_gpus"];

/// Test binaries of the `tests` crate that are not GPU tests and stay out of the bundle: the
/// compile-fail suite (trybuild) compiles programs, which needs cargo and the sources.
const NOT_BUNDLED: &[&str] = &["compile_fail"];

/// The tests that need two GPUs (`#[ignore = "needs two GPUs"]`), by name: the only ignored
/// tests the suite may have, which `run.sh` runs by themselves (`run.sh two-gpu`).
const TWO_GPU_TESTS: &[&str] = &[
    "peer_copies_between_two_devices",
    "launches_on_two_devices_with_the_other_current",
    "another_devices_view_and_stream_are_refused_when_there_are_two_devices",
    "an_operand_on_another_device_is_refused_before_anything_runs",
    "data_parallel_on_two_gpus_gives_the_single_gpu_loss_on_the_combined_batch",
    "one_process_per_gpu_through_the_rendezvous_gives_the_single_gpu_loss",
];

/// Helper binaries that tests start as child processes; bundled in `helpers/`, never run as
/// tests or benchmarks.
const HELPERS: &[&str] = &["test_child"];

/// The DLPack extension module's file in `lib/`: the name Python imports (`cudars_dlpack`,
/// the `#[pymodule]` of cuda-dlpack-py) with the stable-ABI suffix every CPython >= 3.9 loads.
const DLPACK_MODULE_FILE: &str = "cudars_dlpack.abi3.so";

/// The cargo arguments that build the GPU suite's test binaries (and their helpers).
const SUITE_BUILD: &[&str] = &[
    "test",
    "-p",
    "workspace-tests",
    "--features",
    "gpu,library-handles",
    "--release",
    "--no-run",
    "--message-format=json",
];

/// Makes `cuda-sys` find the CUDA headers when `CUDA_INCLUDE_DIR` is not set but `.ci/run`
/// left them in its cache, so NVTX ranges are live in what is built.
pub fn headers_env() -> Vec<(&'static str, String)> {
    if std::env::var_os("CUDA_INCLUDE_DIR").is_some() {
        return Vec::new();
    }
    let cache = std::env::var_os("CUDA_HEADERS_CACHE")
        .map(PathBuf::from)
        .or_else(|| {
            let base = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
            Some(base.join("cuda-rs/cuda-13.0-headers"))
        });
    match cache.map(|c| c.join("include")) {
        Some(dir) if dir.join("cuda.h").is_file() => {
            vec![("CUDA_INCLUDE_DIR", dir.to_string_lossy().into_owned())]
        }
        _ => Vec::new(),
    }
}

/// Builds the GPU suite's test binaries and writes them with `run.sh` into `dir`
/// (`dir/tests/`, `dir/helpers/`, `dir/run.sh`); returns the bytes written.
pub fn suite_dir(dir: &Path) -> Result<u64> {
    let env = headers_env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let messages = cargo_json(SUITE_BUILD, &env)?;
    match cuda_sys_build(&messages) {
        Some(b) if b.nvtx => println!("xtask: NVTX ranges are live (cuda-sys: {})", b.source),
        Some(b) => println!(
            "xtask: warning: NVTX ranges are no-ops in these binaries: no NVTX headers found \
             (cuda-sys: {}); set CUDA_INCLUDE_DIR or run .ci/run once",
            b.source
        ),
        None => println!("xtask: warning: cargo did not report cuda-sys's build script"),
    }
    let built = artifacts(&messages);
    let tests: Vec<&Artifact> = built
        .iter()
        .filter(|a| a.test && a.kinds.iter().any(|k| k == "test"))
        .collect();
    let mut total = 0;
    for t in &tests {
        let name = t.name.as_str();
        if OWN_MODE.contains(&name) {
            total += copy_exe(t, &dir.join("tests"), name)?;
            continue;
        }
        if NOT_BUNDLED.contains(&name) {
            continue;
        }
        if !SUITE.contains(&name) {
            return fail(&format!(
                "test binary `{}` is not in xtask's SUITE list (xtask/src/bundle.rs): add it",
                t.name
            ));
        }
    }
    for name in SUITE {
        let Some(t) = tests.iter().find(|t| t.name == *name) else {
            return fail(&format!("SUITE names `{name}`, which cargo did not build"));
        };
        total += copy_exe(t, &dir.join("tests"), name)?;
        check_ignored(t, name)?;
    }
    for name in HELPERS {
        let Some(h) = built
            .iter()
            .find(|a| a.name == *name && !a.test && a.kinds.iter().any(|k| k == "bin"))
        else {
            return fail(&format!("cargo did not build the helper binary `{name}`"));
        };
        total += copy_exe(h, &dir.join("helpers"), name)?;
    }
    let run_sh = dir.join("run.sh");
    fs::write(&run_sh, run_sh_text()).map_err(|e| e.to_string())?;
    make_executable(&run_sh)?;
    Ok(total)
}

/// Fails when test binary `name` has an ignored test that is not a two-GPU test: such a test
/// would run, and fail, in `run.sh two-gpu` (child-process helpers belong in `test_child`).
fn check_ignored(t: &Artifact, name: &str) -> Result<()> {
    let Some(exe) = &t.executable else {
        return Ok(());
    };
    let out = std::process::Command::new(exe)
        .args(["--list", "--ignored"])
        .output()
        .map_err(|e| format!("{} --list: {e}", exe.display()))?;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(test) = line.strip_suffix(": test") {
            if !TWO_GPU_TESTS.contains(&test) {
                return fail(&format!(
                    "{name}: `{test}` is ignored but is not a two-GPU test (TWO_GPU_TESTS in \
                     xtask/src/bundle.rs); only those may be ignored"
                ));
            }
        }
    }
    Ok(())
}

/// `run.sh` with the suite's list filled in.
fn run_sh_text() -> String {
    RUN_SH.replace("@SUITE@", &SUITE.join(" "))
}

/// Builds the bundle into `dir` (`target/gpu-bundle`, or `target/gpu-bundle-<SET>` for
/// another header set: see `headers::gpu_bundle_args`).
pub fn gpu_bundle_into(dir: &Path) -> Result<()> {
    let dir = dir.to_path_buf();
    if dir.exists() {
        fs::remove_dir_all(&dir).map_err(|e| format!("clean {}: {e}", dir.display()))?;
    }
    let env = headers_env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut total = suite_dir(&dir)?;
    let bins = cargo_json(
        &[
            "build",
            "-p",
            "workspace-tests",
            "--features",
            "gpu,library-handles",
            "--release",
            "--bins",
            "--message-format=json",
        ],
        &env,
    )?;
    for a in artifacts(&bins) {
        if a.kinds.iter().any(|k| k == "bin") && !HELPERS.contains(&a.name.as_str()) {
            total += copy_exe(&a, &dir.join("bench"), &a.name.clone())?;
        }
    }
    let examples = cargo_json(
        &[
            "build",
            "--workspace",
            "--release",
            "--examples",
            "--message-format=json",
        ],
        &env,
    )?;
    for a in artifacts(&examples) {
        if a.kinds.iter().any(|k| k == "example") {
            // Examples lose their symbols too (the suite's binaries keep theirs for
            // backtraces): a quarter of each, what keeps the bundle under 64 MiB.
            total += copy_exe_stripped(&a, &dir.join("examples"), &a.name.clone(), Strip::All)?;
        }
    }
    // The GPT-2 example's program (`gpt2 bench`, `gpt2 train`), beside the examples.
    let gpt2 = cargo_json(
        &[
            "build",
            "-p",
            "gpt2",
            "--release",
            "--bins",
            "--message-format=json",
        ],
        &env,
    )?;
    for a in artifacts(&gpt2) {
        if a.kinds.iter().any(|k| k == "bin") {
            total += copy_exe_stripped(&a, &dir.join("examples"), &a.name.clone(), Strip::All)?;
        }
    }
    // The C ABI of MemoryPool, for the PyTorch / CuPy workloads (tests/bundle/*.py).
    let capi = cargo_json(
        &[
            "build",
            "-p",
            "cudars-mempool-capi",
            "--release",
            "--message-format=json",
        ],
        &env,
    )?;
    fs::create_dir_all(dir.join("lib")).map_err(|e| e.to_string())?;
    for a in artifacts(&capi) {
        if a.name != "cudars_mempool_capi" {
            continue;
        }
        for from in a
            .filenames
            .iter()
            .filter(|p| p.extension().is_some_and(|x| x == "so"))
        {
            if let Some(name) = from.file_name() {
                let to = dir.join("lib").join(name);
                fs::copy(from, &to).map_err(|e| format!("copy {}: {e}", from.display()))?;
                strip_debug(&to);
                total += fs::metadata(&to).map_err(|e| e.to_string())?.len();
                println!("xtask: bundled lib/{}", name.to_string_lossy());
            }
        }
    }
    // The DLPack extension module (PyO3, abi3): `import cudars_dlpack` finds it in lib/
    // under the name of its #[pymodule]; clients_dlpack.py and bench_dlpack.py use it.
    let ext = cargo_json(
        &[
            "build",
            "-p",
            "cudars-dlpack-py",
            "--release",
            "--message-format=json",
        ],
        &env,
    )?;
    let mut ext_found = false;
    for a in artifacts(&ext) {
        if a.name != "cudars_dlpack_py" {
            continue;
        }
        for from in a
            .filenames
            .iter()
            .filter(|p| p.extension().is_some_and(|x| x == "so"))
        {
            let to = dir.join("lib").join(DLPACK_MODULE_FILE);
            fs::copy(from, &to).map_err(|e| format!("copy {}: {e}", from.display()))?;
            // Python needs only its dynamic symbol (PyInit_cudars_dlpack).
            strip_as(&to, Strip::All);
            total += fs::metadata(&to).map_err(|e| e.to_string())?.len();
            println!("xtask: bundled lib/{DLPACK_MODULE_FILE}");
            ext_found = true;
        }
    }
    if !ext_found {
        return fail("cargo built no libcudars_dlpack_py.so for the DLPack extension module");
    }
    // The `cudars` wheel (issue 49): the clients install it on the GPU machine and run from it.
    let wheel = crate::wheel::build(&dir.join("wheels"), &env)?;
    total += fs::metadata(&wheel).map_err(|e| e.to_string())?.len();
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
            // Only the scripts: a `__pycache__` left by a local run is not part of the bundle.
            if !entry.path().is_file() {
                continue;
            }
            let to = dir.join(entry.file_name());
            total += fs::copy(entry.path(), &to)
                .map_err(|e| format!("copy {}: {e}", entry.path().display()))?;
        }
    }
    // The GPT-2 example's PyTorch reference, which gpu_gpt2 runs beside the Rust model.
    let gpt2_ref = root().join("examples/gpt2/reference/train_gpt2_ref.py");
    if gpt2_ref.is_file() {
        total += fs::copy(&gpt2_ref, dir.join("train_gpt2_ref.py"))
            .map_err(|e| format!("copy {}: {e}", gpt2_ref.display()))?;
    }
    // The recorded allocation traces, for the replay benchmark (the repository's traces/;
    // absent traces leave the replay rows out, loudly).
    let traces = root().join("traces");
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
    // What travels to the device machine is an xz archive of the folder (binaries pack ~8:1);
    // the folder itself is over the carry limit once every test, bench and example is in.
    // Not `with_extension`: the 13.5 bundle's directory name has a dot of its own.
    let archive = dir.with_file_name(format!(
        "{}.tar.xz",
        dir.file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
    ));
    let name = dir
        .file_name()
        .ok_or("the bundle folder has no name")?
        .to_string_lossy()
        .to_string();
    let parent = dir.parent().ok_or("the bundle folder has no parent")?;
    let status = std::process::Command::new("tar")
        .env("XZ_OPT", "-6 -T0")
        .arg("-C")
        .arg(parent)
        .arg("-cJf")
        .arg(&archive)
        .arg(&name)
        .status()
        .map_err(|e| format!("tar: {e}"))?;
    if !status.success() {
        return fail(&format!("tar -cJf {} failed: {status}", archive.display()));
    }
    let packed = fs::metadata(&archive).map_err(|e| e.to_string())?.len();
    let arel = archive
        .strip_prefix(root())
        .unwrap_or(&archive)
        .display()
        .to_string();
    println!(
        "xtask: packed as {arel} ({:.1} MiB); run it with a device call: carry [\"{arel}\"], \
         command `tar -xJf {arel} -C {} && bash {rel}/run.sh`",
        packed as f64 / (1 << 20) as f64,
        parent.strip_prefix(root()).unwrap_or(parent).display()
    );
    if packed > MAX_BUNDLE_BYTES {
        return fail(&format!(
            "the packed bundle is {packed} bytes, over the {MAX_BUNDLE_BYTES} that can travel"
        ));
    }
    Ok(())
}

/// Copies `artifact`'s executable to `to/name`, without debug info; returns its bytes.
fn copy_exe(artifact: &Artifact, to: &Path, name: &str) -> Result<u64> {
    copy_exe_stripped(artifact, to, name, Strip::Debug)
}

/// What `strip` removes from a bundled binary.
#[derive(Clone, Copy)]
enum Strip {
    /// Debug info only: symbols stay, so backtraces name functions (the suite, benchmarks).
    Debug,
    /// Debug info and the symbol table (the dynamic symbols stay): examples and the Python
    /// extension module, whose backtraces matter less than the bundle's size.
    All,
}

/// As [`copy_exe`], stripping as `strip` says.
fn copy_exe_stripped(artifact: &Artifact, to: &Path, name: &str, strip: Strip) -> Result<u64> {
    let Some(exe) = &artifact.executable else {
        return fail(&format!(
            "cargo built `{}` without an executable",
            artifact.name
        ));
    };
    fs::create_dir_all(to).map_err(|e| e.to_string())?;
    let dest = to.join(name);
    fs::copy(exe, &dest).map_err(|e| format!("copy {}: {e}", exe.display()))?;
    strip_as(&dest, strip);
    make_executable(&dest)?;
    let dir = to.file_name().map(|d| d.to_string_lossy().into_owned());
    println!("xtask: bundled {}/{name}", dir.unwrap_or_default());
    fs::metadata(&dest)
        .map(|m| m.len())
        .map_err(|e| e.to_string())
}

/// Debug info is most of a binary's size and the bundle must stay under 64 MiB; the symbols
/// stay, so backtraces still name functions. Best effort: without `strip` the file stays whole.
fn strip_debug(path: &Path) {
    strip_as(path, Strip::Debug);
}

/// `strip --strip-debug` or `--strip-all`, best effort.
fn strip_as(path: &Path, strip: Strip) {
    let flag = match strip {
        Strip::Debug => "--strip-debug",
        Strip::All => "--strip-all",
    };
    let _ = std::process::Command::new("strip")
        .arg(flag)
        .arg(path)
        .status();
}

fn make_executable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut perm = fs::metadata(path).map_err(|e| e.to_string())?.permissions();
    perm.set_mode(0o755);
    fs::set_permissions(path, perm).map_err(|e| e.to_string())
}

/// The runner of the GPU suite, here and in the bundle; `@SUITE@` becomes [`SUITE`].
const RUN_SH: &str = r#"#!/usr/bin/env bash
# Runs the GPU bundle (generated by `cargo xtask gpu-bundle`; `cargo xtask ci` runs its GPU
# suite through this same script). Usage: run.sh [MODE] [ARGS for the test binaries...]
#   tests     the GPU suite, one line per binary; on a machine with two or more GPUs the
#             two-GPU tests too (the default)
#   two-gpu   only the tests that need two GPUs (the `#[ignore = "needs two GPUs"]` ones)
#   sanitize  the suite under compute-sanitizer --tool memcheck ($COMPUTE_SANITIZER, else PATH)
#   clients   the CuPy / PyTorch client tests (clients_*.py) through lib/ (ARG: a name filter;
#             $CLIENT_ARGS, e.g. "--seconds 10 --streams 1000", goes to each script)
#   clients-sanitize  the same, shorter, under compute-sanitizer --tool memcheck
#   nccl      the cuda-nccl suite (single- and multi-process, socket transport, a rank killed
#             mid-collective), then bench_nccl beside torch.distributed (plain, --captured,
#             --registered); needs >= 2 GPUs.
#             `run.sh nccl tests` / `run.sh nccl bench` run one part; another word filters tests
#   bench     every benchmark binary (their own output), then peers.py, rtc_peers.py,
#             bench_dlpack.py and workload_bench.py
#   rtc-bench bench_rtc and rtc_peers.py alone (cuda-rtc beside CuPy RawKernel and cuda.core)
#   fft-bench  bench_fft and fft_peers.py (cuFFT through cuda-fft beside torch.fft and cupy.fft)
#   sparse-bench bench_sparse and sparse_peers.py (CSR SpMV of 1e8 nonzeros through cuda-sparse
#             beside torch.sparse and cupyx.scipy.sparse)
#   solver-bench bench_solver and solver_peers.py (Cholesky and SVD of 4096^2 through cuda-solver
#             beside torch.linalg and cupy.linalg)
#   gpt2-bench the GPT-2 example's step, f32 and bf16 (ours eager and replayed) beside PyTorch's
#             (eager, CUDA graph, torch.compile), interleaved ours / theirs / ours
#   blas-bench bench_blas alone (GEMM TFLOP/s, small-GEMM issue, captured GEMMs; it runs
#             blas_peers.py first: torch.matmul, torch.cuda.graph and CuPy beside each row)
#   graph-bench bench_graph_explicit and graph_peers.py alone (explicit graphs, conditional
#             nodes and updates beside cuda.core)
#   dlpack-bench  bench_dlpack.py alone (one DLPack exchange each way through lib/cudars_dlpack,
#             beside cupy.from_dlpack(torch) and torch.from_dlpack(jax))
#   workloads the PyTorch / CuPy workload benchmark alone (workload_bench.py; ~4 min on an H200)
#   examples  every example
# The test modes end with one line: "GPU suite: N passed, N failed on <device>".
# Test binaries run with --test-threads=1 so that memory-level checks see only their own work.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
mode="${1:-tests}"
[ "$#" -gt 0 ] && shift
extra=("$@")
suite="@SUITE@"
passed=0; failed=0
gpus="${CUDA_RS_GPU_COUNT:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}"
device="${CUDA_RS_GPU_NAME:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1)}"
device="${device:-unknown device}"
[ "${gpus:-0}" -ge 2 ] && device="$device (x$gpus)"
sanitizer=()
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
# cuda-rtc opens NVRTC and nvJitLink at run time: take pip's wheels' (CuPy's and cuda.core's)
# when the variables are unset (nvidia/cu13/lib for CUDA 13, nvidia/cuda_nvrtc/lib and
# nvidia/nvjitlink/lib for CUDA 12).
if command -v python3 >/dev/null; then
  nv_dirs="$(python3 -c 'import nvidia; print(" ".join(nvidia.__path__))' 2>/dev/null)"
  for base in $nv_dirs; do
    for f in "$base/cu13/lib/libnvrtc.so.13" "$base/cuda_nvrtc/lib/libnvrtc.so.12"; do
      if [ -z "${CUDA_NVRTC_LIBRARY:-}" ] && [ -f "$f" ]; then export CUDA_NVRTC_LIBRARY="$f"; fi
    done
    for f in "$base/cu13/lib/libnvJitLink.so.13" "$base/nvjitlink/lib/libnvJitLink.so.12"; do
      if [ -z "${CUDA_NVJITLINK_LIBRARY:-}" ] && [ -f "$f" ]; then export CUDA_NVJITLINK_LIBRARY="$f"; fi
    done
    # cuda-blas-sys and cuda-rand-sys (cudars-loader) open cuBLAS, cuBLASLt and cuRAND the
    # same way: PyTorch's and CuPy's nvidia-cublas and nvidia-curand wheels.
    for f in "$base/cu13/lib/libcublas.so.13" "$base/cublas/lib/libcublas.so.12"; do
      if [ -z "${CUDA_CUBLAS_LIBRARY:-}" ] && [ -f "$f" ]; then export CUDA_CUBLAS_LIBRARY="$f"; fi
    done
    for f in "$base/cu13/lib/libcublasLt.so.13" "$base/cublas/lib/libcublasLt.so.12"; do
      if [ -z "${CUDA_CUBLASLT_LIBRARY:-}" ] && [ -f "$f" ]; then export CUDA_CUBLASLT_LIBRARY="$f"; fi
    done
    for f in "$base/cu13/lib/libcurand.so.10" "$base/curand/lib/libcurand.so.10"; do
      if [ -z "${CUDA_CURAND_LIBRARY:-}" ] && [ -f "$f" ]; then export CUDA_CURAND_LIBRARY="$f"; fi
    done
  done
fi
test_timeout=600
run_tests() {
  local wrap=("$@")
  for name in ${names:-$suite}; do
    t="$here/tests/$name"
    if [ ! -x "$t" ]; then
      printf '%-8s %-28s missing from the bundle\n' FAILED "$name"; failed=$((failed + 1)); continue
    fi
    start=$(date +%s%N)
    out="$(timeout "$test_timeout" "${sanitizer[@]}" "$t" --test-threads=1 "${wrap[@]}" "${extra[@]}" 2>&1)"; rc=$?
    ms=$(( ($(date +%s%N) - start) / 1000000 ))
    line="$(printf '%s\n' "$out" | grep -E '^test result:' | tail -n1)"
    p=$(printf '%s\n' "$line" | sed -nE 's/.* ([0-9]+) passed.*/\1/p'); p=${p:-0}
    f=$(printf '%s\n' "$line" | sed -nE 's/.* ([0-9]+) failed.*/\1/p'); f=${f:-0}
    # Under compute-sanitizer, a binary that makes no CUDA call (CPU-only tests) ends "before
    # the first instrumented API call": nothing to check, so its own result line decides.
    if printf '%s\n' "$out" | grep -q 'terminated before first instrumented API call'; then rc=0; fi
    if [ -z "$line" ] || { [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; }; then f=$((f + 1)); fi
    if [ "${#sanitizer[@]}" -gt 0 ] && printf '%s\n' "$out" | grep -qE 'ERROR SUMMARY: [1-9]'; then f=$((f + 1)); fi
    passed=$((passed + p)); failed=$((failed + f))
    status=ok; [ "$f" -eq 0 ] || status=FAILED
    printf '%-8s %-28s %4d passed %4d failed  %6d ms\n' "$status" "$name" "$p" "$f" "$ms"
    if [ "$f" -ne 0 ] || [ -n "${VERBOSE:-}" ]; then printf '%s\n' "$out" | sed 's/^/    | /'; fi
  done
}
run_clients() {
  # Each script prints PASS/FAIL lines and ends with "N passed, N failed".
  local filter="${extra[0]:-}"
  for s in "$here"/clients_*.py; do
    [ -f "$s" ] || continue
    case "$s" in *_common.py) continue ;; esac
    name="$(basename "$s" .py)"
    if [ -n "$filter" ] && [[ "$name" != *"$filter"* ]]; then continue; fi
    start=$(date +%s%N)
    out="$(timeout 1500 python3 "$s" --lib "$here/lib/libcudars_mempool_capi.so" "$@" ${CLIENT_ARGS:-} 2>&1)"; rc=$?
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
two_gpu() {
  if [ "${gpus:-0}" -ge 2 ]; then
    echo "--- two-GPU tests ($gpus GPUs)"; run_tests --ignored
    names=gpu_ipc_two_gpus; run_tests; names=""
  else
    echo "--- two-GPU tests: not run (${gpus:-0} GPU)"
  fi
}
case "$mode" in
  tests) run_tests; two_gpu ;;
  two-gpu)
    if [ "${gpus:-0}" -lt 2 ]; then echo "run.sh two-gpu: needs two GPUs, found ${gpus:-0}"; exit 1; fi
    two_gpu ;;
  sanitize)
    cs="${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || true)}"
    if [ -z "$cs" ] || [ ! -x "$cs" ]; then
      echo "run.sh sanitize: compute-sanitizer not found (PATH, or COMPUTE_SANITIZER=/path/to/it)"; exit 2
    fi
    sanitizer=("$cs" --tool memcheck --report-api-errors no --target-processes all --error-exitcode 86 --print-limit 20)
    export CUDA_RS_STREAMS="${CUDA_RS_STREAMS:-2000}"  # the stream-churn test, shorter under the tool
    export CUDA_RS_ASYNC_FUTURES="${CUDA_RS_ASYNC_FUTURES:-1000}"  # gpu_async's concurrent futures, fewer under the tool
    # gpu_xfer_fault, gpu_async_fault and gpu_fault_reset (their children) provoke kernel faults on purpose:
    # memcheck would report it, rightly; gpu_nvtx installs itself as the NVTX tool, which
    # compute-sanitizer already is. gpu_async (futures dropped mid-flight) does run here.
    names="$(printf '%s\n' $suite | grep -vxE 'gpu_xfer_fault|gpu_async_fault|gpu_fault_reset|gpu_nvtx' | tr '\n' ' ')"
    run_tests; names=""; two_gpu ;;
  bench)
    # Rows go to $BENCH_OUT/results.csv (ours, raw) and peers.csv (CuPy, PyTorch);
    # `cargo xtask bench-report DIR` turns them into the report.
    export BENCH_OUT="${BENCH_OUT:-$here/bench-results}"; mkdir -p "$BENCH_OUT"
    export CUDA_RS_TRACES="$here/traces"
    { date -u +%Y-%m-%dT%H:%MZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n1; } > "$BENCH_OUT/meta.txt"
    for b in "$here"/bench/*; do
      [ -x "$b" ] || continue
      # bench_nccl needs two GPUs and its own mode (run.sh nccl bench).
      [ "$(basename "$b")" = bench_nccl ] && continue
      echo "=== $(basename "$b")"; "$b" "${extra[@]}" || echo "(exit $?)"
    done
    if [ "${#extra[@]}" -eq 0 ] && command -v python3 >/dev/null; then
      echo "=== peers (CuPy, PyTorch)"; python3 "$here/peers.py" --traces "$here/traces"
      echo "=== rtc peers (CuPy RawKernel, cuda.core Program)"; python3 "$here/rtc_peers.py" || echo "(exit $?)"
      echo "=== graph peers (cuda.core while node, update)"; python3 "$here/graph_peers.py" || echo "(exit $?)"
      echo "=== DLPack exchange (cudars_dlpack beside CuPy, PyTorch, JAX)"; python3 "$here/bench_dlpack.py" --lib "$here/lib" || echo "(exit $?)"
      echo "=== workloads (PyTorch, CuPy through the C ABI)"
      python3 "$here/workload_bench.py" --lib "$here/lib/libcudars_mempool_capi.so" --with-plain --budget 330 || echo "(exit $?)"
    fi
    exit 0 ;;
  workloads)
    # Only the workload benchmark (ARGS go to workload_bench.py); rows to $BENCH_OUT as in bench.
    export BENCH_OUT="${BENCH_OUT:-$here/bench-results}"; mkdir -p "$BENCH_OUT"
    [ -f "$BENCH_OUT/meta.txt" ] || { date -u +%Y-%m-%dT%H:%MZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n1; } > "$BENCH_OUT/meta.txt"
    python3 "$here/workload_bench.py" --lib "$here/lib/libcudars_mempool_capi.so" "${extra[@]}"
    exit $? ;;
  rtc-bench)
    # bench_rtc, then the same scenarios through CuPy and cuda.core (rtc_peers.py).
    export BENCH_OUT="${BENCH_OUT:-$here/bench-results}"; mkdir -p "$BENCH_OUT"
    echo "CUDA_NVRTC_LIBRARY=${CUDA_NVRTC_LIBRARY:-unset} CUDA_NVJITLINK_LIBRARY=${CUDA_NVJITLINK_LIBRARY:-unset}"
    echo "=== bench_rtc"; "$here/bench/bench_rtc" || echo "(exit $?)"
    echo "=== rtc peers (CuPy RawKernel, cuda.core Program)"; python3 "$here/rtc_peers.py" "${extra[@]}" || echo "(exit $?)"
    exit 0 ;;
  blas-bench)
    # bench_blas, which first runs blas_peers.py (torch.matmul, torch.cuda.graph, CuPy) and
    # prints each row beside the peers' figures and the ratio.
    echo "CUDA_CUBLAS_LIBRARY=${CUDA_CUBLAS_LIBRARY:-unset}"
    echo "=== bench_blas"; "$here/bench/bench_blas" "${extra[@]}" || echo "(exit $?)"
    exit 0 ;;
  fft-bench)
    # bench_fft (cuda-fft's transforms and its plan-cache hit against a bare cufftExecC2C),
    # then fft_peers.py (torch.fft, cupy.fft) on the same rows.
    echo "=== bench_fft"; "$here/bench/bench_fft" || echo "(exit $?)"
    echo "=== fft peers (torch.fft, cupy.fft)"; python3 "$here/fft_peers.py" || echo "(exit $?)"
    exit 0 ;;
  sparse-bench)
    # bench_sparse (CSR SpMV, 1e8 nonzeros, f32), then sparse_peers.py (torch, cupyx) on the
    # same row.
    echo "=== bench_sparse"; "$here/bench/bench_sparse" || echo "(exit $?)"
    echo "=== sparse peers (torch.sparse, cupyx.scipy.sparse)"; python3 "$here/sparse_peers.py" || echo "(exit $?)"
    exit 0 ;;
  solver-bench)
    # bench_solver (Cholesky and SVD of 4096^2, f32), then solver_peers.py (torch.linalg,
    # cupy.linalg) on the same rows.
    echo "=== bench_solver"; "$here/bench/bench_solver" || echo "(exit $?)"
    echo "=== solver peers (torch.linalg, cupy.linalg)"; python3 "$here/solver_peers.py" || echo "(exit $?)"
    exit 0 ;;
  gpt2-bench)
    # The GPT-2 example's training step (124M, batch 8 x 1024), f32 then bf16 mixed
    # precision: ours eager and graph-replayed, then PyTorch eager, CUDA graph and
    # torch.compile on the same weights (in bf16 also with F.scaled_dot_product_attention),
    # then ours again. `run.sh gpt2-bench f32` or `bf16` runs one precision.
    d="${TMPDIR:-/tmp}/cudars-gpt2-bench"
    "$here/examples/gpt2" init --config 124m --batch 8 --steps 20 --out "$d" || echo "(exit $?)"
    for dt in ${extra[@]:-f32 bf16}; do
      "$here/examples/gpt2" bench --config 124m --batch 8 --steps 10 --dtype "$dt" || echo "(exit $?)"
      attn=""; [ "$dt" = bf16 ] && attn="--sdpa"
      for a in "" $attn; do
        for m in "" --cuda-graph --compile; do
          python3 "$here/train_gpt2_ref.py" --weights "$d/weights.safetensors" --tokens "$d/tokens.safetensors" \
            --batch 8 --dtype "$dt" --bench 10 $m $a | tail -n1 || echo "(exit $?)"
        done
      done
      "$here/examples/gpt2" bench --config 124m --batch 8 --steps 10 --dtype "$dt" || echo "(exit $?)"
    done
    exit 0 ;;
  graph-bench)
    # bench_graph_explicit, then the same loop and update through cuda.core (graph_peers.py).
    export BENCH_OUT="${BENCH_OUT:-$here/bench-results}"; mkdir -p "$BENCH_OUT"
    echo "=== bench_graph_explicit"; "$here/bench/bench_graph_explicit" || echo "(exit $?)"
    echo "=== graph peers (cuda.core while node, update)"; python3 "$here/graph_peers.py" "${extra[@]}" || echo "(exit $?)"
    exit 0 ;;
  dlpack-bench)
    export BENCH_OUT="${BENCH_OUT:-$here/bench-results}"; mkdir -p "$BENCH_OUT"
    echo "=== bench_dlpack.py"; python3 "$here/bench_dlpack.py" --lib "$here/lib" "${extra[@]}" || echo "(exit $?)"
    exit 0 ;;
  clients) run_clients ;;
  clients-sanitize) run_clients --sanitize ;;
  nccl)
    # run.sh nccl [tests|bench|TEST-FILTER]: both parts by default.
    part="${extra[0]:-all}"; extra=()
    case "$part" in all|tests|bench) ;; *) extra=("$part"); part=tests ;; esac
    echo "CUDA_NCCL_LIBRARY=${CUDA_NCCL_LIBRARY:-unset}; GPUs: ${gpus:-0}; NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE"
    if [ "$part" != bench ]; then names=gpu_nccl; test_timeout=1800; run_tests; fi
    if [ "$part" != tests ]; then
      export BENCH_OUT="${BENCH_OUT:-$here/bench-results}"; mkdir -p "$BENCH_OUT"
      [ -f "$BENCH_OUT/meta.txt" ] || { date -u +%Y-%m-%dT%H:%MZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n1; } > "$BENCH_OUT/meta.txt"
      for mode in "" --captured --registered; do
        echo "=== bench_nccl $mode"; "$here/bench/bench_nccl" $mode || { echo "(exit $?)"; failed=$((failed + 1)); }
      done
    fi ;;
  examples)
    export CUDA_RS_TRACES="$here/traces"
    viz="${TMPDIR:-/tmp}/cudars-memviz.$$"
    for e in "$here"/examples/*; do
      [ -x "$e" ] || continue; echo "=== $(basename "$e")"
      case "$(basename "$e")" in
        # A replayed trace as the HTML report and PyTorch's snapshot, which PyTorch's own
        # memory_viz then reads (when PyTorch is installed).
        memviz) "$e" "$here/traces/multistream.trace" --out "$viz.html" --torch-snapshot "$viz.pickle"
          echo "(exit $?)"
          if python3 -c "import torch" 2>/dev/null; then
            python3 -m torch.cuda._memory_viz stats "$viz.pickle" 2>/dev/null | head -n 8
            python3 -m torch.cuda._memory_viz trace_plot "$viz.pickle" -o "$viz.trace.html" 2>/dev/null
            echo "(memory_viz trace_plot exit $?)"
          fi
          rm -f "$viz".* ;;
        *) "$e"; echo "(exit $?)" ;;
      esac
    done; exit 0 ;;
  all) "$0" examples; run_tests; two_gpu; "$0" bench; ;;
  *) echo "usage: run.sh [tests|two-gpu|sanitize|clients|clients-sanitize|nccl|bench|rtc-bench|blas-bench|fft-bench|sparse-bench|solver-bench|gpt2-bench|graph-bench|dlpack-bench|workloads|examples|all] [args]"; exit 2 ;;
esac
echo "GPU suite: $passed passed, $failed failed on $device"
[ "$failed" -eq 0 ]
"#;

#[cfg(test)]
mod tests {
    use super::{run_sh_text, SUITE};

    #[test]
    fn run_sh_runs_exactly_the_suite_list() {
        let text = run_sh_text();
        assert!(!text.contains("@SUITE@"));
        let line = text
            .lines()
            .find(|l| l.starts_with("suite=\""))
            .expect("run.sh names its suite");
        assert_eq!(line, format!("suite=\"{}\"", SUITE.join(" ")));
        assert!(text.contains("echo \"GPU suite: $passed passed, $failed failed on $device\""));
    }
}
