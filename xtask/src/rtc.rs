//! The cuda-rtc parts of `cargo xtask`: cuda-rtc's tests that run NVRTC on the CPU (its
//! bindings snapshot is a row of `bindings.rs`).

use std::path::PathBuf;

use crate::util::{cargo, Result};

/// The NVRTC library for the CPU tests: `$CUDA_NVRTC_LIBRARY`, else the copy `.ci/run`
/// unpacks into the cache.
fn nvrtc_library() -> Option<(PathBuf, Option<PathBuf>)> {
    if let Some(p) = std::env::var_os("CUDA_NVRTC_LIBRARY").map(PathBuf::from) {
        let jit = std::env::var_os("CUDA_NVJITLINK_LIBRARY").map(PathBuf::from);
        return p.is_file().then_some((p, jit));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    let dir = base.join("cuda-rs/rtc-13.0-lib");
    let nvrtc = dir.join("libnvrtc.so.13");
    let jit = dir.join("libnvJitLink.so.13");
    nvrtc
        .is_file()
        .then(|| (nvrtc, jit.is_file().then_some(jit)))
}

/// CI step: cuda-rtc's tests that run NVRTC for real (on the CPU), cuda-graph's NVRTC
/// prelude check, and the compile of the GPU tests' kernels, when the library is there.
pub fn ci_nvrtc_tests() -> Result<()> {
    let Some((nvrtc, jit)) = nvrtc_library() else {
        println!(
            "xtask: no NVRTC library (CUDA_NVRTC_LIBRARY, or .ci/run's cache): cuda-rtc's NVRTC tests are skipped"
        );
        return Ok(());
    };
    let nvrtc = nvrtc.to_string_lossy().into_owned();
    let jit = jit.map(|j| j.to_string_lossy().into_owned());
    let mut env = vec![("CUDA_NVRTC_LIBRARY", nvrtc.as_str())];
    if let Some(j) = &jit {
        env.push(("CUDA_NVJITLINK_LIBRARY", j.as_str()));
    }
    println!("xtask: NVRTC from {nvrtc}");
    cargo(
        &[
            "test",
            "-p",
            "cudars-rtc",
            "--features",
            "nvrtc-tests",
            "--test",
            "nvrtc",
        ],
        &env,
    )?;
    // cuda-graph's condition setters compile with its NVRTC prelude.
    cargo(
        &[
            "test",
            "-p",
            "cudars-graph",
            "--features",
            "nvrtc-tests",
            "--test",
            "nvrtc_conditional",
        ],
        &env,
    )?;
    // The GPU tests' kernels (workspace_tests::kernels) compile, with the parameters their
    // launchers pass.
    cargo(
        &[
            "test",
            "-p",
            "workspace-tests",
            "--features",
            "nvrtc-tests",
            "--lib",
        ],
        &env,
    )
}
