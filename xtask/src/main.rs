//! `cargo xtask <command>`: the workspace's automation.
//!
//! | command | what |
//! | --- | --- |
//! | `ci` | fmt, clippy (warnings denied), build, CPU tests, docs (warnings denied), the bindings snapshot check, the main example with and without headers; then the CUDA 12.0, 12.4 and 12.8 headers (fetched and cached): bindgen, `cargo check --workspace --all-targets`, cuda-sys tests |
//! | `bindings` | regenerates `cuda-sys/src/generated/driver.rs` from the headers found |
//! | `nccl-bindings` | regenerates `cuda-nccl-sys/src/generated/nccl.rs` from the `nccl.h` found |
//! | `gpu-bundle [--headers SET]` | builds every GPU test, benchmark and example binary into `target/gpu-bundle/` with `run.sh`; with `--headers 12.4`, from those headers into `target/gpu-bundle-12.4/` |
//! | `replay [TRACE...]` | replays allocation traces (default `../shared/traces/*.trace`) through MemoryPool on the simulated backend |
//! | `bench-report DIR` | `results.csv` + `peers.csv` of one benchmark run -> `bench/results/REPORT.md` and SVG plots |

mod bundle;
mod headers;
mod nccl;
mod report;
mod util;

use std::process::ExitCode;

use util::{cargo, fail, Result};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("bindings") => bindings(),
        Some("nccl-bindings") => nccl::bindings(),
        Some("gpu-bundle") => headers::gpu_bundle_args(&args[1..]),
        Some("replay") => replay(&args[1..]),
        Some("bench-report") => match args.get(1) {
            Some(dir) => report::bench_report(std::path::Path::new(dir)),
            None => {
                Err("usage: cargo xtask bench-report <dir with results.csv and peers.csv>".into())
            }
        },
        _ => {
            eprintln!(
                "usage: cargo xtask <ci|bindings|nccl-bindings|gpu-bundle [--headers 12.4]|replay [TRACE...]|bench-report DIR>"
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

fn ci() -> Result<()> {
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
    step("bindings");
    let (source, out_dir) = util::cuda_sys_build_info(&[])?;
    println!("xtask: cuda-sys bindings: {source}");
    if source.starts_with("bindgen") {
        let fresh = std::fs::read_to_string(out_dir.join("driver.rs"))
            .map_err(|e| format!("read fresh bindings: {e}"))?;
        let snapshot =
            std::fs::read_to_string(util::root().join("cuda-sys/src/generated/driver.rs"))
                .map_err(|e| format!("read snapshot: {e}"))?;
        if fresh != snapshot {
            return fail("the bindings snapshot differs from a fresh generation: run `cargo xtask bindings` and commit");
        }
        println!("xtask: the snapshot matches a fresh generation");
    } else {
        println!("xtask: no headers or libclang: the snapshot check needs them and is skipped");
    }
    step("NCCL bindings");
    nccl::ci_bindings_check()?;
    step("tests (CPU)");
    cargo(&["test", "--workspace"], &[])?;
    // Feature-gated CPU tests (library handles' missing-library errors, ndarray transfers);
    // `--all-features` on the workspace would also turn on the GPU suite of `tests`.
    cargo(
        &[
            "test",
            "-p",
            "cuda-core",
            "-p",
            "cuda-xfer",
            "--all-features",
        ],
        &[],
    )?;
    step("docs, warnings denied");
    cargo(
        &["doc", "--workspace", "--no-deps", "--all-features"],
        &[("RUSTDOCFLAGS", "-D warnings")],
    )?;
    step("main example");
    example_check(&[])?;
    ci_cuda12()?;
    step("main example and loader tests on the snapshot (no headers)");
    let env = [
        ("CUDA_SYS_USE_SNAPSHOT", "1"),
        ("CARGO_TARGET_DIR", "target/snapshot"),
    ];
    let (source, _) = util::cuda_sys_build_info(&env)?;
    if !source.starts_with("snapshot") {
        return fail(&format!("expected the snapshot path, got: {source}"));
    }
    cargo(&["test", "-p", "tests", "--test", "loader"], &env)?;
    nccl::ci_snapshot_build(&env)?;
    example_check(&env)?;
    println!("xtask: ci passed");
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

fn bindings() -> Result<()> {
    let (source, out_dir) = util::cuda_sys_build_info(&[])?;
    if !source.starts_with("bindgen") {
        return fail(&format!("bindings were not generated ({source}); install libclang and point CUDA_INCLUDE_DIR at cuda.h"));
    }
    let target = util::root().join("cuda-sys/src/generated/driver.rs");
    std::fs::copy(out_dir.join("driver.rs"), &target).map_err(|e| format!("copy: {e}"))?;
    println!("xtask: wrote {} from {source}", target.display());
    Ok(())
}

/// Replays traces through `MemoryPool` on the simulated backend (the pool's `replay` example):
/// peak requested, peak reserved, their ratio and ns per operation for each.
fn replay(traces: &[String]) -> Result<()> {
    let mut files: Vec<String> = traces.to_vec();
    if files.is_empty() {
        let dir = util::root().join("../shared/traces");
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
        "cuda-mempool",
        "--example",
        "replay",
        "--",
    ];
    args.extend(files.iter().map(String::as_str));
    cargo(&args, &[])
}

/// The CUDA 12 header sets (see `headers::ci_set`).
fn ci_cuda12() -> Result<()> {
    for set in headers::CI_SETS {
        step(&format!(
            "CUDA {set} headers: bindgen, check (all targets), cuda-sys tests"
        ));
        headers::ci_set(set)?;
    }
    Ok(())
}

fn step(name: &str) {
    println!("\n=== xtask ci: {name}");
}
