//! The raw-binding crates (cuda-sys, cuda-nccl-sys, cuda-rtc-sys, cuda-blas-sys,
//! cuda-rand-sys) in one table, and what `cargo xtask` does with each: regenerate the
//! checked-in snapshot (`bindings`, `nccl-bindings`, `rtc-bindings`, `blas-bindings`,
//! `rand-bindings`), check it against a fresh generation, and build from it when no headers
//! are found (steps of `ci`). A new `-sys` crate (another math library, built with
//! `cudars_loader::build`) is one more row.

use std::path::PathBuf;

use crate::util::{cargo, cargo_json, fail, root, Result};

/// One raw-binding crate.
pub struct SysCrate {
    /// Cargo package name.
    pub package: &'static str,
    /// The library, for messages.
    pub what: &'static str,
    /// The checked-in snapshot, relative to the workspace root.
    pub snapshot: &'static str,
    /// The file the build script writes into its `OUT_DIR`.
    pub generated: &'static str,
    /// The variable the build script sets to say where the bindings came from.
    pub source_var: &'static str,
    /// The variable that makes the build script take the snapshot.
    pub snapshot_var: &'static str,
    /// The `cargo xtask` command that regenerates the snapshot.
    pub command: &'static str,
    /// What to install or set when the bindings were not generated.
    pub hint: &'static str,
}

/// cuda-sys: the driver API.
pub const CUDA: SysCrate = SysCrate {
    package: "cudars-sys",
    what: "CUDA driver",
    snapshot: "cuda-sys/src/generated/driver.rs",
    generated: "driver.rs",
    source_var: "CUDA_SYS_BINDINGS_SOURCE",
    snapshot_var: "CUDA_SYS_USE_SNAPSHOT",
    command: "bindings",
    hint: "install libclang and point CUDA_INCLUDE_DIR at cuda.h",
};

/// cuda-nccl-sys: NCCL.
pub const NCCL: SysCrate = SysCrate {
    package: "cudars-nccl-sys",
    what: "NCCL",
    snapshot: "cuda-nccl-sys/src/generated/nccl.rs",
    generated: "nccl.rs",
    source_var: "CUDA_NCCL_SYS_BINDINGS_SOURCE",
    snapshot_var: "CUDA_NCCL_SYS_USE_SNAPSHOT",
    command: "nccl-bindings",
    hint: "install libclang and point NCCL_INCLUDE_DIR at nccl.h",
};

/// cuda-rtc-sys: NVRTC and nvJitLink.
pub const RTC: SysCrate = SysCrate {
    package: "cudars-rtc-sys",
    what: "NVRTC / nvJitLink",
    snapshot: "cuda-rtc-sys/src/generated/rtc.rs",
    generated: "rtc.rs",
    source_var: "CUDA_RTC_SYS_BINDINGS_SOURCE",
    snapshot_var: "CUDA_RTC_SYS_USE_SNAPSHOT",
    command: "rtc-bindings",
    hint: "install libclang and point CUDA_INCLUDE_DIR (or CUDA_RTC_INCLUDE_DIR) at nvrtc.h and nvJitLink.h",
};

/// cuda-blas-sys: cuBLAS and cuBLASLt (its build script is `cudars_loader::build`).
pub const BLAS: SysCrate = SysCrate {
    package: "cudars-blas-sys",
    what: "cuBLAS / cuBLASLt",
    snapshot: "cuda-blas-sys/src/generated/blas.rs",
    generated: "blas.rs",
    source_var: "CUDA_BLAS_SYS_BINDINGS_SOURCE",
    snapshot_var: "CUDA_BLAS_SYS_USE_SNAPSHOT",
    command: "blas-bindings",
    hint: "install libclang and point CUDA_BLAS_INCLUDE_DIR at cublas_v2.h and cublasLt.h (crt/ beside them) and CUDA_INCLUDE_DIR at the CUDA runtime headers (.ci/run fetches both)",
};

/// cuda-rand-sys: cuRAND's host API (its build script is `cudars_loader::build`).
pub const RAND: SysCrate = SysCrate {
    package: "cudars-rand-sys",
    what: "cuRAND",
    snapshot: "cuda-rand-sys/src/generated/rand.rs",
    generated: "rand.rs",
    source_var: "CUDA_RAND_SYS_BINDINGS_SOURCE",
    snapshot_var: "CUDA_RAND_SYS_USE_SNAPSHOT",
    command: "rand-bindings",
    hint: "install libclang and point CUDA_RAND_INCLUDE_DIR at curand.h (crt/ beside it) and CUDA_INCLUDE_DIR at the CUDA runtime headers (.ci/run fetches both)",
};

/// cuda-fft-sys: cuFFT (its build script is `cudars_loader::build`).
pub const FFT: SysCrate = SysCrate {
    package: "cudars-fft-sys",
    what: "cuFFT",
    snapshot: "cuda-fft-sys/src/generated/fft.rs",
    generated: "fft.rs",
    source_var: "CUDA_FFT_SYS_BINDINGS_SOURCE",
    snapshot_var: "CUDA_FFT_SYS_USE_SNAPSHOT",
    command: "fft-bindings",
    hint: "install libclang and point CUDA_FFT_INCLUDE_DIR at cufft.h and CUDA_INCLUDE_DIR at the CUDA runtime headers (.ci/run fetches both)",
};

/// cuda-solver-sys: cuSOLVER's dense API (its build script is `cudars_loader::build`).
pub const SOLVER: SysCrate = SysCrate {
    package: "cudars-solver-sys",
    what: "cuSOLVER",
    snapshot: "cuda-solver-sys/src/generated/solver.rs",
    generated: "solver.rs",
    source_var: "CUDA_SOLVER_SYS_BINDINGS_SOURCE",
    snapshot_var: "CUDA_SOLVER_SYS_USE_SNAPSHOT",
    command: "solver-bindings",
    hint: "install libclang and point CUDA_SOLVER_INCLUDE_DIR at cusolverDn.h (cusolver_common.h, cublas_api.h and crt/ beside it) and CUDA_INCLUDE_DIR at the CUDA runtime headers (.ci/run fetches both)",
};

/// cuda-sparse-sys: cuSPARSE's generic API (its build script is `cudars_loader::build`).
pub const SPARSE: SysCrate = SysCrate {
    package: "cudars-sparse-sys",
    what: "cuSPARSE",
    snapshot: "cuda-sparse-sys/src/generated/sparse.rs",
    generated: "sparse.rs",
    source_var: "CUDA_SPARSE_SYS_BINDINGS_SOURCE",
    snapshot_var: "CUDA_SPARSE_SYS_USE_SNAPSHOT",
    command: "sparse-bindings",
    hint: "install libclang and point CUDA_SPARSE_INCLUDE_DIR at cusparse.h and CUDA_INCLUDE_DIR at the CUDA runtime headers (.ci/run fetches both)",
};

/// Every raw-binding crate, in dependency order.
pub const ALL: [&SysCrate; 8] = [&CUDA, &NCCL, &RTC, &BLAS, &RAND, &FFT, &SOLVER, &SPARSE];

/// The environment of `ci`'s no-header build: cuda-sys on its snapshot, in a target directory
/// of its own ([`snapshot_build`] adds each crate's own snapshot variable).
pub const SNAPSHOT_ENV: [(&str, &str); 2] = [
    ("CUDA_SYS_USE_SNAPSHOT", "1"),
    ("CARGO_TARGET_DIR", "target/snapshot"),
];

/// `cargo xtask bindings-check`: the bindings steps of `ci` alone, for every crate of [`ALL`]:
/// each snapshot against a fresh generation ([`check_fresh`]), then each crate built from its
/// snapshot and its library tests ([`snapshot_build`]).
pub fn check_all() -> Result<()> {
    for krate in ALL {
        println!("\n=== xtask: {} bindings", krate.what);
        check_fresh(krate)?;
    }
    for krate in ALL {
        println!("\n=== xtask: {} from its snapshot", krate.package);
        snapshot_build(krate, &SNAPSHOT_ENV)?;
    }
    println!(
        "xtask: bindings of {} checked",
        ALL.map(|k| k.package).join(", ")
    );
    Ok(())
}

/// Builds the crate; returns where its bindings came from (`bindgen ...` or `snapshot ...`)
/// and its `OUT_DIR`.
pub fn build_info(krate: &SysCrate, env: &[(&str, &str)]) -> Result<(String, PathBuf)> {
    let messages = cargo_json(
        &["build", "-p", krate.package, "--message-format=json"],
        env,
    )?;
    let (at, space) = (format!("{}@", krate.package), format!("{} ", krate.package));
    let m = messages.iter().find(|m| {
        m["reason"] == "build-script-executed"
            && m["package_id"]
                .as_str()
                .is_some_and(|id| id.contains(&at) || id.contains(&space))
    });
    let Some(m) = m else {
        return fail(&format!(
            "cargo did not report {}'s build script",
            krate.package
        ));
    };
    let out_dir = m["out_dir"]
        .as_str()
        .ok_or("no out_dir in cargo's message")?;
    let source = m["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|kv| kv[0] == krate.source_var)
        .and_then(|kv| kv[1].as_str())
        .unwrap_or("unknown")
        .to_string();
    Ok((source, PathBuf::from(out_dir)))
}

/// `cargo xtask <command>`: regenerates the snapshot from the headers found.
pub fn regenerate(krate: &SysCrate) -> Result<()> {
    let (source, out_dir) = build_info(krate, &[])?;
    if !source.starts_with("bindgen") {
        return fail(&format!(
            "{} bindings were not generated ({source}); {}",
            krate.what, krate.hint
        ));
    }
    std::fs::copy(out_dir.join(krate.generated), root().join(krate.snapshot))
        .map_err(|e| format!("copy: {e}"))?;
    println!("xtask: wrote {} from {source}", krate.snapshot);
    Ok(())
}

/// CI step: with the headers, the snapshot must equal a fresh generation; without them, the
/// check is skipped with a line (the crate then builds from the snapshot).
pub fn check_fresh(krate: &SysCrate) -> Result<()> {
    let (source, out_dir) = build_info(krate, &[])?;
    println!("xtask: {} bindings: {source}", krate.package);
    if source.starts_with("bindgen") {
        let fresh = std::fs::read_to_string(out_dir.join(krate.generated))
            .map_err(|e| format!("read fresh {} bindings: {e}", krate.what))?;
        let snapshot = std::fs::read_to_string(root().join(krate.snapshot))
            .map_err(|e| format!("read {} snapshot: {e}", krate.what))?;
        if fresh != snapshot {
            return fail(&format!(
                "the {} bindings snapshot differs from a fresh generation: run `cargo xtask {}` and commit",
                krate.what, krate.command
            ));
        }
        println!(
            "xtask: the {} snapshot matches a fresh generation",
            krate.what
        );
    } else if headers_found_but_failed(&source) {
        // The headers were there and libclang ran, but the generation failed (a header it
        // includes is missing, or the post-processing broke): the snapshot would hide that.
        return fail(&format!(
            "the {} headers were found but the bindings could not be generated ({source}); {}",
            krate.what, krate.hint
        ));
    } else {
        println!(
            "xtask: no headers or libclang for {}: the snapshot check needs them and is skipped",
            krate.what
        );
    }
    Ok(())
}

/// A snapshot build whose reason says the headers were found and libclang ran, but bindgen
/// or the code after it failed (`snapshot (bindgen failed: ... 'crt/host_defines.h' file not
/// found)`, `snapshot (parse bindgen output: ...)`): every reason but the build scripts' own
/// for a missing header (`<header> not found (looked in ...)`), a missing libclang (`bindgen
/// could not run`) or a variable asking for the snapshot (`DOCS_RS is set`,
/// `<CRATE>_USE_SNAPSHOT is set`).
fn headers_found_but_failed(source: &str) -> bool {
    let Some(why) = source.strip_prefix("snapshot (") else {
        return false;
    };
    let skipped = (why.contains(" not found (looked in ") && !why.starts_with("bindgen"))
        || why.starts_with("bindgen could not run")
        || why.starts_with("DOCS_RS is set")
        || why.contains("_USE_SNAPSHOT is set");
    !skipped
}

/// CI step on the no-header build (`env` selects the snapshot target dir): the crate must
/// take the snapshot path; its own tests then run on it, except cuda-sys's (`ci` runs the
/// loader tests and the main example on that build instead).
pub fn snapshot_build(krate: &SysCrate, env: &[(&str, &str)]) -> Result<()> {
    let mut env = env.to_vec();
    env.push((krate.snapshot_var, "1"));
    let (source, _) = build_info(krate, &env)?;
    if !source.starts_with("snapshot") {
        return fail(&format!(
            "expected the {} snapshot path, got: {source}",
            krate.what
        ));
    }
    if krate.package == CUDA.package {
        return Ok(());
    }
    cargo(&["test", "-p", krate.package, "--lib"], &env)
}

#[cfg(test)]
mod tests {
    use super::headers_found_but_failed;

    #[test]
    fn only_a_failed_generation_from_found_headers_fails_the_check() {
        for skipped in [
            "bindgen over /usr/local/cuda/include",
            "snapshot (cuda.h not found (looked in CUDA_INCLUDE_DIR, CUDA_PATH and /usr/include))",
            "snapshot (curand.h not found (looked in CUDA_RAND_INCLUDE_DIR, CUDA_INCLUDE_DIR and /usr/include))",
            "snapshot (bindgen could not run (libclang missing?))",
            "snapshot (bindgen could not run: Unable to find libclang)",
            "snapshot (DOCS_RS is set)",
            "snapshot (CUDA_BLAS_SYS_USE_SNAPSHOT is set)",
        ] {
            assert!(!headers_found_but_failed(skipped), "{skipped}");
        }
        for failed in [
            "snapshot (bindgen failed: clang diagnosed error: driver_types.h:59:10: fatal error: 'crt/host_defines.h' file not found\n)",
            "snapshot (parse bindgen output: expected `;`)",
            "snapshot (generated tokens do not parse: unexpected token)",
        ] {
            assert!(headers_found_but_failed(failed), "{failed}");
        }
    }
}
