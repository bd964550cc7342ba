//! The cuda-rtc parts of `cargo xtask`: the cuda-rtc-sys bindings snapshot (refresh and
//! freshness check), its no-header build, and cuda-rtc's tests that run NVRTC on the CPU.

use std::path::PathBuf;

use crate::util::{cargo, cargo_json, fail, root, Result};

const SNAPSHOT: &str = "cuda-rtc-sys/src/generated/rtc.rs";

/// Builds cuda-rtc-sys; returns where its bindings came from and its OUT_DIR.
fn build_info(env: &[(&str, &str)]) -> Result<(String, PathBuf)> {
    let messages = cargo_json(
        &["build", "-p", "cudars-rtc-sys", "--message-format=json"],
        env,
    )?;
    let m = messages.iter().find(|m| {
        m["reason"] == "build-script-executed"
            && m["package_id"]
                .as_str()
                .is_some_and(|id| id.contains("cudars-rtc-sys"))
    });
    let Some(m) = m else {
        return fail("cargo did not report cuda-rtc-sys's build script");
    };
    let out_dir = m["out_dir"]
        .as_str()
        .ok_or("no out_dir in cargo's message")?;
    let source = m["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|kv| kv[0] == "CUDA_RTC_SYS_BINDINGS_SOURCE")
        .and_then(|kv| kv[1].as_str())
        .unwrap_or("unknown")
        .to_string();
    Ok((source, PathBuf::from(out_dir)))
}

/// `cargo xtask rtc-bindings`: regenerates the snapshot from the headers found.
pub fn bindings() -> Result<()> {
    let (source, out_dir) = build_info(&[])?;
    if !source.starts_with("bindgen") {
        return fail(&format!(
            "NVRTC bindings were not generated ({source}); install libclang and point CUDA_INCLUDE_DIR (or CUDA_RTC_INCLUDE_DIR) at nvrtc.h and nvJitLink.h"
        ));
    }
    std::fs::copy(out_dir.join("rtc.rs"), root().join(SNAPSHOT))
        .map_err(|e| format!("copy: {e}"))?;
    println!("xtask: wrote {SNAPSHOT} from {source}");
    Ok(())
}

/// CI step: with the headers, the snapshot must equal a fresh generation; without them, the
/// crate builds from the snapshot.
pub fn ci_bindings_check() -> Result<()> {
    let (source, out_dir) = build_info(&[])?;
    println!("xtask: cuda-rtc-sys bindings: {source}");
    if source.starts_with("bindgen") {
        let fresh = std::fs::read_to_string(out_dir.join("rtc.rs"))
            .map_err(|e| format!("read fresh NVRTC bindings: {e}"))?;
        let snapshot = std::fs::read_to_string(root().join(SNAPSHOT))
            .map_err(|e| format!("read NVRTC snapshot: {e}"))?;
        if fresh != snapshot {
            return fail("the NVRTC bindings snapshot differs from a fresh generation: run `cargo xtask rtc-bindings` and commit");
        }
        println!("xtask: the NVRTC snapshot matches a fresh generation");
    } else {
        println!("xtask: no nvrtc.h/nvJitLink.h or libclang: the NVRTC snapshot check needs them and is skipped");
    }
    Ok(())
}

/// CI step on the no-header build (`env` selects the snapshot target dir): cuda-rtc-sys must
/// take the snapshot path, and its tests pass on it.
pub fn ci_snapshot_build(env: &[(&str, &str)]) -> Result<()> {
    let mut env = env.to_vec();
    env.push(("CUDA_RTC_SYS_USE_SNAPSHOT", "1"));
    let (source, _) = build_info(&env)?;
    if !source.starts_with("snapshot") {
        return fail(&format!("expected the NVRTC snapshot path, got: {source}"));
    }
    cargo(&["test", "-p", "cudars-rtc-sys", "--lib"], &env)
}

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
