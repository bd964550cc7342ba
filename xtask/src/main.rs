//! `cargo xtask <command>`: the workspace's automation.
//!
//! | command | what |
//! | --- | --- |
//! | `ci [--gpu\|--no-gpu] [--sanitize] [--strict]` | fmt, clippy (warnings denied), build, CPU tests, docs (warnings denied), packaging, the bindings snapshot check, the main example with and without headers, a snapshot build of cuda-sys switching to bindgen when headers and libclang appear, the CUDA 12.0/12.4/12.8 and 13.5 header sets (bindgen, `cargo check`, cuda-sys tests), the NCCL, NVRTC, cuBLAS and cuRAND bindings (each snapshot against a fresh generation, then built from the snapshot), cuda-rtc's tests with NVRTC on the CPU and the GPU tests' kernels compiled by it (when the library is found), the memory report in headless Chromium (skipped with a line when Chromium is absent, unless `--strict` or `CI` is set); then the GPU suite when a GPU is usable (`--gpu` requires it, `--no-gpu` skips it, `--sanitize` runs it under compute-sanitizer); ends with one `GPU suite: ...` line |
//! | `gpu-suite [--gpu\|--no-gpu] [--sanitize]` | only the GPU part of `ci` |
//! | `check-common` | the helper files copied into several crates are identical (a step of `ci`) |
//! | `circles` | the circles of files in each library crate (files that name each other through their `use` paths), and the files over 800 lines |
//! | `bindings` | regenerates `cuda-sys/src/generated/driver.rs` from the headers found |
//! | `nccl-bindings` | regenerates `cuda-nccl-sys/src/generated/nccl.rs` from the `nccl.h` found |
//! | `rtc-bindings` | regenerates `cuda-rtc-sys/src/generated/rtc.rs` from the `nvrtc.h` and `nvJitLink.h` found |
//! | `blas-bindings` | regenerates `cuda-blas-sys/src/generated/blas.rs` from the `cublas_v2.h` and `cublasLt.h` found (`CUDA_BLAS_INCLUDE_DIR`, with `crt/`; `.ci/run` fetches them) |
//! | `rand-bindings` | regenerates `cuda-rand-sys/src/generated/rand.rs` from the `curand.h` found (`CUDA_RAND_INCLUDE_DIR`, with `crt/`; `.ci/run` fetches it) |
//! | `fft-bindings` | regenerates `cuda-fft-sys/src/generated/fft.rs` from the `cufft.h` found (`CUDA_FFT_INCLUDE_DIR`; `.ci/run` fetches it) |
//! | `solver-bindings` | regenerates `cuda-solver-sys/src/generated/solver.rs` from the `cusolverDn.h` found (`CUDA_SOLVER_INCLUDE_DIR`; `.ci/run` fetches it) |
//! | `sparse-bindings` | regenerates `cuda-sparse-sys/src/generated/sparse.rs` from the `cusparse.h` found (`CUDA_SPARSE_INCLUDE_DIR`; `.ci/run` fetches it) |
//! | `wheel [--out DIR]` | builds the `cudars` Python wheel (maturin) into `DIR` |
//! | `bindings-check` | the bindings steps of `ci` alone, for every `-sys` crate: each snapshot against a fresh generation (when the headers and libclang are found; headers found but a failed generation is an error), then each crate built from its snapshot (`target/snapshot`) and its library tests |
//! | `gpu-bundle [--headers SET]` | builds every GPU test, benchmark and example binary into `target/gpu-bundle/` with `run.sh`; with `--headers 13.5`, from those headers into `target/gpu-bundle-13.5/` |
//! | `replay [TRACE...]` | replays allocation traces (default `traces/*.trace`) through MemoryPool on the simulated backend |
//! | `memviz TRACE [--out FILE.html] [--torch-snapshot FILE.pickle]` | replays a trace through MemoryPool on the simulated backend with a history recorder and writes the self-contained HTML report (`cudars_mempool::history::report`) and/or PyTorch's memory snapshot pickle (`cudars_mempool::history::torch`) |
//! | `memviz-check` | the report of the multistream trace in headless Chromium: a screenshot (`target/memviz-screenshot.png`), its plot's pixels, no console output (a step of `ci`) |
//! | `bench-report DIR` | `results.csv` + `peers.csv` of one benchmark run -> `bench/results/REPORT.md` and SVG plots |
//!
//! Arguments are parsed by hand: sixteen commands and a handful of flags, where an argument
//! parser would add a dozen crates to every `cargo xtask` build.

mod bindings;
mod browser;
mod bundle;
mod circles;
mod gpu;
mod headers;
mod report;
mod rtc;
mod util;
mod wheel;

use std::process::ExitCode;

use util::{cargo, fail, Result};

/// The library crates, in dependency order: each is packaged (`cargo package`) by CI.
const LIBRARY_PACKAGES: &[&str] = &[
    "cudars-sys",
    "cudars-core",
    "cudars-mempool",
    "cudars-mempool-capi",
    "cudars-graph",
    "cudars-xfer",
    "cudars-nccl-sys",
    "cudars-nccl",
    "cudars-rtc-sys",
    "cudars-rtc",
    "cudars-loader",
    "cudars-blas-sys",
    "cudars-blas",
    "cudars-rand-sys",
    "cudars-rand",
    "cudars-fft-sys",
    "cudars-fft",
    "cudars-solver-sys",
    "cudars-solver",
    "cudars-sparse-sys",
    "cudars-sparse",
    "cudars-dlpack",
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("ci") => gpu::Options::parse(&args[1..]).and_then(ci),
        Some("gpu-suite") => gpu::Options::parse(&args[1..]).and_then(|opts| gpu::run(opts).1),
        Some("bindings") => bindings::regenerate(&bindings::CUDA),
        Some("check-common") => check_common_copies(),
        Some("circles") => circles::run(),
        Some("nccl-bindings") => bindings::regenerate(&bindings::NCCL),
        Some("rtc-bindings") => bindings::regenerate(&bindings::RTC),
        Some("blas-bindings") => bindings::regenerate(&bindings::BLAS),
        Some("rand-bindings") => bindings::regenerate(&bindings::RAND),
        Some("fft-bindings") => bindings::regenerate(&bindings::FFT),
        Some("solver-bindings") => bindings::regenerate(&bindings::SOLVER),
        Some("sparse-bindings") => bindings::regenerate(&bindings::SPARSE),
        Some("bindings-check") => bindings::check_all(),
        Some("gpu-bundle") => headers::gpu_bundle_args(&args[1..]),
        Some("wheel") => wheel::wheel_args(&args[1..]),
        Some("replay") => replay(&args[1..]),
        Some("memviz") => memviz(&args[1..]),
        Some("memviz-check") => browser::ci_memviz_screenshot().map(|line| println!("{line}")),
        Some("bench-report") => match args.get(1) {
            Some(dir) => report::bench_report(std::path::Path::new(dir)),
            None => {
                Err("usage: cargo xtask bench-report <dir with results.csv and peers.csv>".into())
            }
        },
        _ => {
            eprintln!(
                "usage: cargo xtask <ci [--gpu|--no-gpu] [--sanitize] [--strict]|gpu-suite [--gpu|--no-gpu] [--sanitize]|bindings|nccl-bindings|rtc-bindings|blas-bindings|rand-bindings|fft-bindings|solver-bindings|sparse-bindings|bindings-check|check-common|circles|gpu-bundle [--headers 12.4]|wheel [--out DIR]|replay [TRACE...]|memviz TRACE [--out FILE.html] [--torch-snapshot FILE.pickle]|bench-report DIR>"
            );
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The CPU steps, then the GPU suite; the last line printed is always the GPU suite's.
fn ci(opts: gpu::Options) -> Result<()> {
    if let Err(e) = cpu_steps(&opts) {
        eprintln!("xtask: {e}");
        println!("GPU suite: not run (the CPU steps failed)");
        return Err("ci failed".into());
    }
    if let Some(line) = step_times() {
        println!("{line}");
    }
    println!("{}", disk_line());
    println!("xtask: CPU steps passed");
    step("GPU suite");
    gpu::run(opts).1
}

fn cpu_steps(opts: &gpu::Options) -> Result<()> {
    step("shared helper copies are identical");
    check_common_copies()?;
    step("cargo fmt --check");
    cargo(&["fmt", "--all", "--check"], &[])?;
    step("clippy, warnings denied");
    cargo(
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--all-features",
            "--",
            "-D",
            "warnings",
        ],
        &[],
    )?;
    step("build");
    cargo(
        &["build", "--workspace", "--all-targets", "--all-features"],
        &[],
    )?;
    for krate in bindings::ALL {
        step(&format!("{} bindings", krate.what));
        bindings::check_fresh(krate)?;
    }
    let build = util::cuda_sys_build_info(&[])?;
    if build.nvtx {
        step("NVTX ranges reach a tool (tests/tests/gpu_nvtx.rs needs no GPU)");
        cargo(
            &[
                "test",
                "-p",
                "workspace-tests",
                "--features",
                "gpu",
                "--test",
                "gpu_nvtx",
            ],
            &[],
        )?;
    } else {
        println!("xtask: NVTX compiled out (no NVTX headers): the NVTX tool test is skipped");
    }
    step("tests (CPU)");
    cargo(&["test", "--workspace"], &[])?;
    // Feature-gated CPU tests (library handles' missing-library errors, ndarray transfers);
    // `--all-features` on the workspace would also turn on the GPU suite of `tests`.
    cargo(
        &[
            "test",
            "-p",
            "cudars-core",
            "-p",
            "cudars-xfer",
            "--all-features",
        ],
        &[],
    )?;
    step("cuda-rtc and the test kernels with NVRTC on the CPU (no GPU needed)");
    rtc::ci_nvrtc_tests()?;
    step("the memory report in headless Chromium: a screenshot, its pixels, its console");
    match browser::chromium_found() {
        Err(why) if !opts.strict => println!(
            "memviz-check: SKIPPED ({why}); `cargo xtask ci --strict`, or CI=true, makes this \
             a failure"
        ),
        _ => println!("{}", browser::ci_memviz_screenshot()?),
    }
    step("docs, warnings denied");
    cargo(
        &["doc", "--workspace", "--no-deps", "--all-features"],
        &[("RUSTDOCFLAGS", "-D warnings")],
    )?;
    step("packaging");
    package()?;
    step("the Python wheel: built, installed into a fresh virtual environment, CPU test");
    wheel::ci_check()?;
    step("GPU suite detection without a driver");
    detection_check()?;
    step("main example");
    example_check(&[])?;
    step("cuda-sys switches from the snapshot to bindgen when headers and libclang appear");
    headers::ci_rerun_check()?;
    ci_header_sets()?;
    step("the -sys crates on their snapshots (no headers), with the main example and loader tests");
    let env = bindings::SNAPSHOT_ENV;
    for krate in bindings::ALL {
        bindings::snapshot_build(krate, &env)?;
    }
    cargo(&["test", "-p", "workspace-tests", "--test", "loader"], &env)?;
    example_check(&env)?;
    Ok(())
}

/// The packages [`package`] also verifies: built from their `.crate` with `DOCS_RS=1` and no
/// headers. `cudars-loader` must be among them, ahead of the math `-sys` crates: their build
/// scripts use it (feature `build`), and the local registry `cargo package` builds them against
/// holds only the packages named.
const VERIFIED_PACKAGES: &[&str] = &[
    "cudars-sys",
    "cudars-loader",
    "cudars-blas-sys",
    "cudars-rand-sys",
];

/// `cargo package` for every library crate, in dependency order against a local overlay
/// registry (`--workspace`; it holds only the packages named, so every workspace dependency of
/// a package must be in [`LIBRARY_PACKAGES`]). Verifying each package means building it again
/// from its `.crate`, so only the crates whose build script falls back on a bindings snapshot
/// are verified, where it matters: `cudars-sys` and the math `-sys` crates (with
/// `cudars-loader`, their build scripts' generator) must build inside the packaged crate with
/// no headers and no libclang, as on docs.rs (`DOCS_RS=1`). The others are checked for
/// contents and manifest (`--no-verify`).
fn package() -> Result<()> {
    let mut args = vec!["package", "--allow-dirty", "--no-verify", "--quiet"];
    for p in LIBRARY_PACKAGES {
        args.extend(["-p", p]);
    }
    cargo(&args, &[])?;
    let mut args = vec!["package", "--allow-dirty", "--quiet"];
    for p in VERIFIED_PACKAGES {
        args.extend(["-p", p]);
    }
    cargo(
        &args,
        &[
            ("DOCS_RS", "1"),
            ("CUDA_INCLUDE_DIR", "/nonexistent"),
            ("CUDA_BLAS_INCLUDE_DIR", "/nonexistent"),
            ("CUDA_RAND_INCLUDE_DIR", "/nonexistent"),
        ],
    )?;
    println!(
        "xtask: packaged {}; verified {} (built from their .crate with DOCS_RS=1)",
        LIBRARY_PACKAGES.join(", "),
        VERIFIED_PACKAGES.join(", ")
    );
    Ok(())
}

/// `cargo xtask gpu-suite` with no driver (`CUDA_DRIVER_LIBRARY` names a missing file): exit 0
/// and the `not run` line; with `--gpu`, a non-zero exit and the loader's reason.
fn detection_check() -> Result<()> {
    let missing = "/nonexistent/xtask-ci/libcuda.so.1";
    for (flag, want_success) in [(None, true), (Some("--gpu"), false)] {
        // Through cargo, not this process's own path: the build step above may have replaced
        // the xtask binary that is running.
        let mut args = vec!["run", "--quiet", "-p", "xtask", "--", "gpu-suite"];
        args.extend(flag);
        let out = util::cargo_output(&args, &[("CUDA_DRIVER_LIBRARY", missing)])?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stdout.lines().last().unwrap_or_default();
        let shown = format!("xtask gpu-suite {}", flag.unwrap_or_default());
        if out.status.success() != want_success
            || !last.starts_with("GPU suite: not run (")
            || !last.contains(missing)
        {
            return fail(&format!(
                "`{shown}` with no driver: exit {}, stdout:\n{stdout}\nstderr:\n{stderr}",
                out.status
            ));
        }
        println!(
            "xtask: `{}` with no driver: {} | {}",
            shown.trim(),
            out.status,
            last
        );
        if !want_success && !stderr.contains(missing) {
            return fail(&format!("`{shown}` did not give the reason:\n{stderr}"));
        }
    }
    Ok(())
}

/// Runs the main example: on a machine with a driver it must succeed; without one it must exit
/// with status 1 and print the loader's error, never panic.
fn example_check(env: &[(&str, &str)]) -> Result<()> {
    let out = util::cargo_output(
        &["run", "--quiet", "--release", "--example", "device_info"],
        env,
    )?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    match out.status.code() {
        Some(0) => {
            print!("{stdout}");
            Ok(())
        }
        Some(1)
            if stderr.contains("CUDA driver library not found") || stderr.contains("cuInit") =>
        {
            println!(
                "xtask: device_info with no usable driver printed: {}",
                stderr.trim()
            );
            Ok(())
        }
        code => fail(&format!(
            "device_info exited with {code:?}:\n{stdout}\n{stderr}"
        )),
    }
}

/// Replays traces through `MemoryPool` on the simulated backend (the pool's `replay` example):
/// peak requested, peak reserved, their ratio and ns per operation for each.
fn replay(traces: &[String]) -> Result<()> {
    let mut files: Vec<String> = traces.to_vec();
    if files.is_empty() {
        let dir = util::root().join("traces");
        let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for entry in entries.flatten() {
            if entry.path().extension().is_some_and(|x| x == "trace") {
                files.push(entry.path().to_string_lossy().into_owned());
            }
        }
        files.sort();
    }
    let mut args = vec![
        "run",
        "--quiet",
        "--release",
        "-p",
        "cudars-mempool",
        "--example",
        "replay",
        "--",
    ];
    args.extend(files.iter().map(String::as_str));
    cargo(&args, &[])
}

/// `memviz TRACE [--out FILE.html] [--torch-snapshot FILE.pickle]`: runs the `memviz` example
/// of cudars-mempool (release), with every path made absolute so it means what it meant where
/// `cargo xtask` was run. `--out` writes the HTML report, `--torch-snapshot` PyTorch's memory
/// snapshot pickle (`cudars_mempool::history::torch`); at least one is needed.
fn memviz(args: &[String]) -> Result<()> {
    let usage = "usage: cargo xtask memviz TRACE [--out FILE.html] [--torch-snapshot FILE.pickle]";
    let (mut trace, mut out, mut pickle) = (None, None, None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--out" | "-o" => out = it.next(),
            "--torch-snapshot" => pickle = it.next(),
            _ if trace.is_none() => trace = Some(a),
            _ => return fail(&format!("unexpected argument {a:?}; {usage}")),
        }
    }
    let Some(trace) = trace else {
        return fail(usage);
    };
    if out.is_none() && pickle.is_none() {
        return fail(usage);
    }
    let cwd = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    let abs = |p: &String| cwd.join(p).to_string_lossy().into_owned();
    let mut run: Vec<String> = [
        "run",
        "--quiet",
        "--release",
        "-p",
        "cudars-mempool",
        "--example",
        "memviz",
        "--",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    run.push(abs(trace));
    if let Some(out) = out {
        run.extend(["--out".to_owned(), abs(out)]);
    }
    if let Some(pickle) = pickle {
        run.extend(["--torch-snapshot".to_owned(), abs(pickle)]);
    }
    let run: Vec<&str> = run.iter().map(String::as_str).collect();
    cargo(&run, &[])
}

/// The other header sets (see `headers::ci_set`).
fn ci_header_sets() -> Result<()> {
    headers::note_newer_13();
    for set in headers::CI_SETS {
        step(&format!(
            "CUDA {set} headers: bindgen, check (all targets), cuda-sys tests"
        ));
        headers::ci_set(set)?;
    }
    Ok(())
}

/// The copies of the examples' and benchmarks' shared helper (`common/mod.rs`: printing that
/// survives a closed stdout). Each crate keeps its own copy, since a packaged crate cannot
/// reach a file outside its directory (`#[path]` would break `cargo package`); the first is
/// the one to edit, and CI fails when any other differs from it.
const COMMON_COPIES: &[&str] = &[
    "cuda-core/examples/common/mod.rs",
    "cuda-mempool/examples/common/mod.rs",
    "cuda-mempool/benches/common/mod.rs",
    "cuda-graph/examples/common/mod.rs",
    "cuda-xfer/examples/common/mod.rs",
    "cuda-rtc/examples/common/mod.rs",
    "cuda-blas/examples/common/mod.rs",
    "tests/src/bin/common/mod.rs",
];

/// Fails unless every file of [`COMMON_COPIES`] is byte-identical to the first, and no other
/// `common/mod.rs` under an `examples`, `benches` or `src/bin` folder escaped the list.
fn check_common_copies() -> Result<()> {
    let root = util::root();
    let read = |rel: &str| std::fs::read(root.join(rel)).map_err(|e| format!("read {rel}: {e}"));
    let canonical = read(COMMON_COPIES[0])?;
    let mut differ = Vec::new();
    for rel in &COMMON_COPIES[1..] {
        if read(rel)? != canonical {
            differ.push(*rel);
        }
    }
    if !differ.is_empty() {
        return fail(&format!(
            "{} differ from {}: copy it over them (one source, several copies)",
            differ.join(", "),
            COMMON_COPIES[0]
        ));
    }
    let mut unlisted = Vec::new();
    for entry in std::fs::read_dir(&root).map_err(|e| format!("read {}: {e}", root.display()))? {
        let krate = entry.map_err(|e| e.to_string())?.path();
        for folder in ["examples", "benches", "src/bin"] {
            let candidate = krate.join(folder).join("common/mod.rs");
            if candidate.is_file() {
                let rel = candidate
                    .strip_prefix(&root)
                    .map_err(|e| e.to_string())?
                    .to_string_lossy()
                    .into_owned();
                if !COMMON_COPIES.contains(&rel.as_str()) {
                    unlisted.push(rel);
                }
            }
        }
    }
    if !unlisted.is_empty() {
        return fail(&format!(
            "{} not in xtask's COMMON_COPIES: add it there",
            unlisted.join(", ")
        ));
    }
    println!(
        "xtask: {} copies of {} are identical",
        COMMON_COPIES.len(),
        COMMON_COPIES[0]
    );
    Ok(())
}

/// When the first step began and when the last one did.
static STEP_CLOCK: std::sync::Mutex<Option<(std::time::Instant, std::time::Instant)>> =
    std::sync::Mutex::new(None);

/// Seconds the last step took and since the first began, as a line (CI's time, step by step).
fn step_times() -> Option<String> {
    let now = std::time::Instant::now();
    let mut clock = STEP_CLOCK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let line = clock.map(|(first, last)| {
        format!(
            "xtask: (that step took {:.0} s; {:.0} s since the first)",
            (now - last).as_secs_f64(),
            (now - first).as_secs_f64()
        )
    });
    *clock = Some((clock.map_or(now, |(first, _)| first), now));
    line
}

/// What the build left on disk: the size of `target/` and its largest folders, and what `df`
/// says is free there (CI's machine once ran out of disk in the last step).
fn disk_line() -> String {
    fn size(path: &std::path::Path) -> u64 {
        let Ok(meta) = std::fs::symlink_metadata(path) else {
            return 0;
        };
        if !meta.is_dir() {
            return meta.len();
        }
        std::fs::read_dir(path)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| size(&e.path()))
            .sum()
    }
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let target = util::root().join("target");
    let mut parts: Vec<(u64, String)> = std::fs::read_dir(&target)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| {
            (
                size(&e.path()),
                e.file_name().to_string_lossy().into_owned(),
            )
        })
        .collect();
    parts.sort_by_key(|p| std::cmp::Reverse(p.0));
    let total: u64 = parts.iter().map(|p| p.0).sum();
    let top: Vec<String> = parts
        .iter()
        .take(4)
        .map(|(b, n)| format!("{n} {:.2}", gib(*b)))
        .collect();
    let free = std::process::Command::new("df")
        .args(["-h", "--output=avail"])
        .arg(&target)
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .nth(1)
                .map(|l| l.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    format!(
        "xtask: target/ holds {:.2} GiB ({}); {free} free",
        gib(total),
        top.join(", ")
    )
}

fn step(name: &str) {
    if let Some(line) = step_times() {
        println!("{line}");
    }
    println!("\n=== xtask ci: {name}");
}
