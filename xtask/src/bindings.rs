//! The three raw-binding crates (cuda-sys, cuda-nccl-sys, cuda-rtc-sys) in one table, and
//! what `cargo xtask` does with each: regenerate the checked-in snapshot (`bindings`,
//! `nccl-bindings`, `rtc-bindings`), check it against a fresh generation, and build from it
//! when no headers are found (steps of `ci`). A new `-sys` crate (the math libraries) is one
//! more row.

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

/// Every raw-binding crate, in dependency order.
pub const ALL: [&SysCrate; 3] = [&CUDA, &NCCL, &RTC];

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
    } else {
        println!(
            "xtask: no headers or libclang for {}: the snapshot check needs them and is skipped",
            krate.what
        );
    }
    Ok(())
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
